"""Re-predict a Core run's pipetrain settings from its saved profiles and clusters, with other cost terms.

    PYTHONPATH=. .venv/bin/python benchmarks/refit_core.py benchmarks/results/core-prepost \
        --pairs "pipetrain 1f1b m=1|pipetrain zbv m=8" --out benchmarks/results/refit-core-prepost

For each model of the run (``core.json``, ``profile_<model>.json``, ``cluster_<model>.json``), every
pipetrain setting is re-planned as the run planned it (the planned setting is read back) and predicted:

- with the run's own cluster (its prediction, for reference);
- with the compute speed and per-action overhead fitted (:func:`pipetrain.calibrate.fit.fit_terms`)
  to the run's *measured* medians of two of its settings (``--pairs``, each ``"A|B"``), then every
  setting's |error| against its measured median: over all settings and over those not fitted to.

This asks whether two terms fitted to two runs of a model predict its other settings, without running
anything (the calibration of :mod:`pipetrain.calibrate.fit` fits the same terms to its own runs).
Output under ``--out``: ``refit.json`` and ``refit.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import setting_plans

from pipetrain import api
from pipetrain.calibrate.fit import fit_terms, with_terms
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile

DEFAULT_PAIRS = ("pipetrain 1f1b m=1|pipetrain zbv m=8", "pipetrain gpipe m=1|pipetrain zb1 m=8",
                 "pipetrain 1f1b m=1|pipetrain 1f1b m=8")


def measured_medians(core: dict[str, Any], model: str) -> dict[str, float]:
    """Per pipetrain setting (and planned) of ``model``, the median measured iteration (s)."""
    by: dict[str, list[float]] = {}
    for run in core["runs"]:
        if run["model"] == model and run["status"] == "ok" and run["label"].startswith(("pipetrain", "planned")):
            by.setdefault(run["label"], []).append(run["iteration_s"])
    return {label: statistics.median(times) for label, times in by.items() if label != "planned-noalloc"}


def replanned(run: Path, model: dict[str, Any], micro: list[int]) -> tuple[Profile, Cluster, dict[str, Plan]]:
    """The run's profile and cluster of ``model``, and its plans (as ``bench_core.setup_model`` built them)."""
    name, batch = model["model"], model["batch"]
    graph = build_model(name)
    profile = Profile.from_json((run / f"profile_{name}.json").read_text())
    cluster = Cluster.from_json((run / f"cluster_{name}.json").read_text())
    plans = setting_plans(graph, CostModel(profile, cluster), batch, micro)
    plans["planned"] = Plan.from_json(json.dumps(model["planned_plan"]))
    return profile, cluster, plans


def errors(plans: dict[str, Plan], profile: Profile, cluster: Cluster, measured: dict[str, float]) -> dict[str, float]:
    """Per setting, (predicted − measured) / measured."""
    return {k: (api.predict(p, profile, cluster)[1].iteration_s - measured[k]) / measured[k]
            for k, p in plans.items() if k in measured}


def _summary(errs: dict[str, float], skip: tuple[str, ...] = ()) -> dict[str, object]:
    rest = {k: abs(v) for k, v in errs.items() if k not in skip}
    worst = max(rest, key=lambda k: rest[k])
    return {"median": statistics.median(rest.values()), "worst": rest[worst], "worst_setting": worst, "n": len(rest)}


def refit_model(run: Path, core: dict[str, Any], model: dict[str, Any],
                pairs: list[tuple[str, ...]]) -> dict[str, object]:
    measured = measured_medians(core, model["model"])
    micro = sorted({int(k.rsplit("=", 1)[1]) for k in measured if "m=" in k})
    profile, cluster, plans = replanned(run, model, micro)
    result: dict[str, object] = {"model": model["model"], "as_run": _summary(errors(plans, profile, cluster, measured))}
    fits = []
    for pair in pairs:
        speed, overhead = fit_terms([plans[k] for k in pair], profile, cluster, [measured[k] for k in pair])
        errs = errors(plans, profile, with_terms(cluster, speed, overhead), measured)
        fits.append({"pair": list(pair), "speed": speed, "overhead_s": overhead, "all": _summary(errs),
                     "others": _summary(errs, pair), "errors": errs})
    result["fits"] = fits
    return result


def _md(results: list[dict[str, Any]], run: Path) -> str:
    lines = [f"# Re-predicting {run} with terms fitted to two of its settings", "",
             "| model | terms | speed | µs per action | median abs. error | worst | worst setting | "
             "others: median | others: worst |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in results:
        a = r["as_run"]
        lines.append(f"| {r['model']} | as run | — | — | {a['median']:.1%} | {a['worst']:.1%} | "
                     f"{a['worst_setting']} | | |")
        for f in r["fits"]:
            al, ot = f["all"], f["others"]
            lines.append(f"| {r['model']} | fitted to {' + '.join(f['pair'])} | {f['speed']:.3f} | "
                         f"{f['overhead_s'] * 1e6:.0f} | {al['median']:.1%} | {al['worst']:.1%} | "
                         f"{al['worst_setting']} | {ot['median']:.1%} | {ot['worst']:.1%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("run", type=Path, help="a Core run's output folder (core.json, profile_*.json, cluster_*.json)")
    p.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), help='settings to fit to, each "A|B"')
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    core = json.loads((args.run / "core.json").read_text())
    pairs = [tuple(s.split("|")) for s in args.pairs]
    results = [refit_model(args.run, core, m, pairs) for m in core["models"]]  # type: ignore[arg-type]
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "refit.json", json.dumps(results, indent=1))
    text = _md(results, args.run)
    write_atomic(args.out / "refit.md", text)
    print(text)


if __name__ == "__main__":
    main()
