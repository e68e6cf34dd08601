"""The real-models benchmark's report, from its rows only (so ``--rereport`` redraws a stored run).

Rows: one ``kind: "setup"`` row per model (plans, plan times, torch's split points, what torch's
``pipeline()`` could not do) and one ``kind: "run"`` row per run (``model``, ``label``, ``round``,
``status``, ``samples_per_s``, ``step_times_s``, ``wall_s``). A configuration's figure is its median
samples/s over rounds; the best torch configuration is the fastest by median among those run every
round; a ratio is the median of the within-round ratios (the runs back to back).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from harness import Chart, Headline, Report, Row, RunInfo
from harness.experiment import Area

from common.real_models import MODELS

__all__ = ["real_report", "summary"]


def _by_round(runs: Sequence[Row], model: str, label: str) -> dict[int, float]:
    return {r["round"]: r["samples_per_s"] for r in runs
            if r["model"] == model and r["label"] == label and r["samples_per_s"]}


def _ratio(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float | None, list[float]]:
    """Median of ``a / b`` over the rounds both have, and the ratios."""
    ratios = [a[r] / b[r] for r in sorted(a.keys() & b.keys())]
    return (statistics.median(ratios) if ratios else None), ratios


def summary(setups: Sequence[Row], runs: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Per model: each configuration's median samples/s, the best torch one, the paired ratios."""
    out: dict[str, dict[str, Any]] = {}
    for setup in setups:
        name = setup["model"]
        labels = dict.fromkeys(r["label"] for r in runs if r["model"] == name)
        rounds = {label: _by_round(runs, name, label) for label in labels}
        medians = {label: statistics.median(v.values()) for label, v in rounds.items() if v}
        most = max((len(v) for label, v in rounds.items() if label.startswith("torch")), default=0)
        paired = {label: medians[label] for label, v in rounds.items() if label.startswith("torch") and len(v) == most}
        best = max(paired, key=lambda label: paired[label]) if most else None  # among those run every round
        ratios: dict[str, Any] = {}
        for own in (label for label in medians if label.startswith("pipetrain")):
            for other in ("single", best):
                if other is not None:
                    median, pairs = _ratio(_by_round(runs, name, own), _by_round(runs, name, other))
                    ratios[f"{own} / {other}"] = {"median": median, "pairs": pairs}
        failed = sorted({f"{r['label']}: {r['status']}" for r in runs if r["model"] == name and r["status"] != "ok"})
        out[name] = {"medians": medians, "rounds": {label: len(v) for label, v in rounds.items()},
                     "torch_best": best, "ratios": ratios, "failed": failed}
    return out


def _tables(setups: Sequence[Row], result: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| model | configuration | samples/s (median) | ms/step |", "|---|---|---:|---:|"]
    for setup in setups:
        s, batch = result[setup["model"]], setup["batch"]
        shown = [label for label in s["medians"] if not label.startswith("torch")]
        for label in shown + ([s["torch_best"]] if s["torch_best"] else []):
            sps = s["medians"][label]
            what = {"pipetrain": f"pipetrain balanced ({setup['plans']['balanced']})",
                    "pipetrain-auto": f"pipetrain auto ({setup['plans']['auto']})"}.get(label, label)
            what += " (best torch)" if label == s["torch_best"] else ""
            what = what.replace("|", "\\|")  # a plan's stages are separated by "|": not a cell's end
            lines.append(f"| {setup['model']} b={batch} | {what} | {sps:.1f} | {batch / sps * 1e3:.0f} |")
    lines += ["", "| model | ratio | median of rounds | per round |", "|---|---|---:|---|"]
    for setup in setups:
        for key, value in result[setup["model"]]["ratios"].items():
            median = f"{value['median']:.3f}" if value["median"] is not None else "-"
            lines.append(f"| {setup['model']} | {key} | {median} | {', '.join(f'{x:.3f}' for x in value['pairs'])} |")
    lines += ["", "| model | torch configuration | samples/s (median) | rounds |", "|---|---|---:|---:|"]
    for setup in setups:
        s = result[setup["model"]]
        lines += [f"| {setup['model']} | {label} | {sps:.1f} | {s['rounds'][label]} |"
                  for label, sps in s["medians"].items() if label.startswith("torch")]
        lines += [f"| {setup['model']} | {line} | - | - |" for line in s["failed"]]
    lines += ["", "| model | capture s | profile s | balanced planner s | auto planner s | plan time s "
              "(profile + balanced) |", "|---|---:|---:|---:|---:|---:|"]
    for setup in setups:
        t = setup["seconds"]
        lines.append(f"| {setup['model']} | {t['capture']:.1f} | {t['profile']:.1f} | {t['balanced']:.1f} | "
                     f"{t['auto']:.1f} | {t['profile'] + t['balanced']:.1f} |")
    lines += ["", *(f"torch's `pipeline()` on {s['model']} with its default config: {s['pipeline_with_default_config']}"
                    for s in setups if s["pipeline_with_default_config"] != "ok")]
    return lines


def _headlines(setups: Sequence[Row], result: dict[str, dict[str, Any]], info: RunInfo) -> list[Headline]:
    out = []
    for setup in setups:
        s, title = result[setup["model"]], MODELS[setup["model"]].title
        config = (f"measured, 2 ranks × 1 thread (gloo), batch {setup['batch']}, {info.repeats} "
                  f"round{'s' if info.repeats != 1 else ''}")
        pairs: list[tuple[str, str, Area]] = [("pipetrain", s["torch_best"], "torch"),
                                              ("pipetrain", "single", "methods"),
                                              ("pipetrain-auto", s["torch_best"], "torch")]
        for own, other, area in pairs:
            ratio = s["ratios"].get(f"{own} / {other}")
            if ratio is None:
                continue
            what = "pipetrain's default plan" if own == "pipetrain" else "pipetrain's auto plan"
            against = f"the best torch schedule ({other})" if area == "torch" else "one process"
            out.append(Headline(area, f"{title}: {what} / {against}", ratio["median"], unit="×", config=config))
    return out


def _charts(setups: Sequence[Row], result: dict[str, dict[str, Any]]) -> list[Chart]:
    """Per model, samples/s of each configuration (a torch schedule: its fastest micro-batch count)."""
    own = {"pipetrain": "pipetrain", "pipetrain-auto": "pipetrain auto", "single": "one process"}
    charts = []
    for setup in setups:
        best: dict[str, float] = {}
        for label, sps in result[setup["model"]]["medians"].items():
            key = own.get(label) or " ".join(label.split()[:2])
            best[key] = max(best.get(key, 0.0), sps)
        title = MODELS[setup["model"]].title
        charts.append(Chart("torch", f"samples-{setup['model']}", f"{title}, batch {setup['batch']}: samples/s, "
                            "pipetrain against torch's schedules (each at its fastest m)", "bars", "samples/s",
                            categories=tuple(best), series=((title, tuple(best.values())),)))
    return charts


def real_report(rows: list[Row], info: RunInfo) -> Report:
    """The tables (throughput, ratios, every torch configuration, plan times), headlines and charts."""
    setups = [r for r in rows if r.get("kind") == "setup"]
    runs = [r for r in rows if r.get("kind") == "run"]
    result = summary(setups, runs)
    return Report("\n".join(_tables(setups, result)) + "\n", tuple(_headlines(setups, result, info)),
                  tuple(_charts(setups, result)))
