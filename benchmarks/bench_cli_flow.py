"""Do predictions hold in the everyday CLI flow? Issue 32's targets, measured through the commands a user types.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_cli_flow.py --out benchmarks/results/cli-flow
    PYTHONPATH=. .venv/bin/python benchmarks/bench_cli_flow.py --quick --out /tmp/flow   # smoke run

For each model — ``mlp-digits``, ``gpt-tiny`` and a user's transformer (``benchmarks/flow_transformer.py``:
a ``ModuleList`` of ``nn.TransformerEncoderLayer`` on the digits read as rows) — on 2 local ranks, at the
commands' default batch, with ``--optimizer adamw``, in two modes:

* ``uncalibrated``: ``pipetrain plan`` three times in a row (does it choose the same plan, or say the
  candidates are within noise?), then ``simulate`` → ``train`` → ``compare`` on the first plan;
* ``calibrated``: ``pipetrain probe --calibrate --model M`` first, then the same with ``--cluster`` its file.

Each command runs as a subprocess (``python -m pipetrain``), as a user would run it. The figures: the
predicted iteration (``simulate``'s timeline) against the measured (the median timed step of ``train``;
the median of three trainings, as this machine's runs of one plan differ by ±15-25%),
and each action kind's mean duration predicted against measured (F, B, W, SEND_*, RECV_*, STEP), as
signed errors ``predicted / measured − 1``. Targets (issue 32): iteration within 15% uncalibrated, 10%
calibrated; every action kind's mean within 25%.

Output under ``--out``: ``<model>/<mode>/`` holds every command's files and output (``*.log``);
``results.json`` (every figure) and ``table.md`` (the tables for BENCHMARKS.md); ``cache/``, the
commands' probe cache, empty at the start, so each model's first ``plan`` probes this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from pipetrain.fileio import write_atomic
from pipetrain.plan.plan import Plan
from pipetrain.simulate.timeline import Timeline

MODELS: dict[str, list[str]] = {
    "mlp-digits": ["--model", "mlp-digits"],
    "gpt-tiny": ["--model", "gpt-tiny"],
    "user transformer": ["--model", "benchmarks.flow_transformer:build", "--data",
                         "benchmarks.flow_transformer:digit_rows"],
}
RANKS, OPTIMIZER = "2", "adamw"
_environment = dict(os.environ)
"""The commands' environment: :func:`main` points ``PIPETRAIN_CACHE_DIR`` at ``--out``'s ``cache/``, so
the first ``plan`` of each model probes this machine afresh (no probe or calibration of an earlier run)."""


def _run(args: list[str], log: Path) -> str:
    """``python -m pipetrain *args`` from the repository root; its output, also written to ``log``.

    Raises:
        RuntimeError: the command failed (its output's tail in the message).
    """
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipetrain", *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, check=False, env=_environment)
    text = f"$ pipetrain {' '.join(args)}\n{done.stdout}{done.stderr}\n[{time.perf_counter() - started:.1f} s]\n"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    if done.returncode != 0:
        raise RuntimeError(f"pipetrain {args[0]} failed ({done.returncode}):\n{text[-3000:]}")
    return text


def _label(plan: Plan) -> str:
    """``method [sizes] layers`` of a plan, e.g. ``1f1b [16×2] 5/4``."""
    sizes = plan.stages[0].forward_sizes
    micro = f"[{sizes[0]}×{len(sizes)}]" if len(set(sizes)) == 1 else f"[{', '.join(map(str, sizes))}]"
    return f"{plan.method.value} {micro} {'/'.join(s.label for s in plan.stages)}"


def _kind_means(timeline: Timeline) -> dict[str, float]:
    """Mean seconds of each action kind over every rank's events (SEND/RECV kinds by name)."""
    spans: dict[str, list[float]] = defaultdict(list)
    for event in timeline.events:
        spans[event.action.kind.name].append(event.duration_s)
    return {kind: statistics.fmean(durations) for kind, durations in spans.items()}


def _error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if measured > 0 else float("nan")


def _flow(name: str, model: list[str], mode: str, folder: Path, steps: int, trains: int) -> dict[str, object]:
    """One model in one mode: three plans, then simulate, ``trains`` × train, compare on the first plan;
    its figures (measured: the median over the trainings of each one's median step)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = model[model.index("--data"):] if "--data" in model else []
    cluster: list[str] = []
    if mode == "calibrated":
        _run(["probe", *model, "--ranks", RANKS, "--calibrate", "--out", str(folder / "probe.json")],
             folder / "probe.log")
        cluster = ["--cluster", str(folder / "probe.json")]
    plans, noise_lines = [], []
    for i in range(3):
        text = _run(["plan", *model, "--ranks", RANKS, "--optimizer", OPTIMIZER, *cluster,
                     "--out", str(folder / f"plan{i}.json")], folder / f"plan{i}.log")
        plans.append(Plan.from_json((folder / f"plan{i}.json").read_text()))
        noise_lines += [line.strip() for line in text.splitlines() if "noise" in line]
    plan_file = str(folder / "plan0.json")
    _run(["simulate", "--plan", plan_file, *data, *cluster, "--out-dir", str(folder / "sim")], folder / "simulate.log")
    runs = []
    for i in range(trains):  # this machine's runs of one plan differ by ±15-25%: the median of several
        run = folder / f"run{i}"
        _run(["train", "--plan", plan_file, *data, "--optimizer", OPTIMIZER, "--steps", str(steps),
              "--out-dir", str(run)], folder / f"train{i}.log")
        runs.append(Timeline.load(run / "measured.json"))
    _run(["compare", "--plan", plan_file, "--predicted", str(folder / "sim" / "predicted.json"),
          "--measured", str(folder / "run0" / "measured.json"), "--out", str(folder / "compare.png")],
         folder / "compare.log")
    predicted = Timeline.load(folder / "sim" / "predicted.json")
    measured_s = statistics.median(t.iteration_s for t in runs)
    pred_kinds, each_run = _kind_means(predicted), [_kind_means(t) for t in runs]
    meas_kinds = {kind: statistics.median(k[kind] for k in each_run) for kind in set.intersection(
        *(set(k) for k in each_run))}
    return {
        "model": name, "mode": mode, "plans": [_label(p) for p in plans],
        "planned_ms": [p.prediction.iteration_s * 1e3 if p.prediction else None for p in plans],
        "noise_lines": noise_lines,
        "predicted_ms": predicted.iteration_s * 1e3, "measured_ms": measured_s * 1e3,
        "measured_runs_ms": [t.iteration_s * 1e3 for t in runs],
        "iteration_error": _error(predicted.iteration_s, measured_s),
        "kinds": {kind: {"predicted_ms": pred_kinds[kind] * 1e3, "measured_ms": meas_kinds[kind] * 1e3,
                         "error": _error(pred_kinds[kind], meas_kinds[kind])}
                  for kind in sorted(pred_kinds.keys() & meas_kinds.keys())},
    }


def _tables(rows: list[dict[str, object]]) -> str:
    """The Markdown of BENCHMARKS.md: iteration and consistency per run, then the action kinds."""
    lines = ["| model | mode | plan (3 runs of `plan`) | same plan? | predicted ms | measured ms (median; runs) "
             "| error | target |", "|---|---|---|---|---:|---:|---:|---|"]
    for row in rows:
        plans = row["plans"]
        assert isinstance(plans, list)
        same = "yes" if len(set(plans)) == 1 else ("within noise (said)" if row["noise_lines"] else "**no**")
        target = 0.15 if row["mode"] == "uncalibrated" else 0.10
        measured_runs = row["measured_runs_ms"]
        assert isinstance(measured_runs, list)
        runs = ", ".join(f"{ms:.1f}" for ms in measured_runs)
        error = float(row["iteration_error"])  # type: ignore[arg-type]
        lines.append(f"| {row['model']} | {row['mode']} | {'; '.join(dict.fromkeys(plans))} | {same} | "
                     f"{row['predicted_ms']:.2f} | {row['measured_ms']:.2f} ({runs}) | {error:+.1%} | "
                     f"{'met' if abs(error) <= target else 'missed'} (±{target:.0%}) |")
    kinds = sorted({kind for row in rows for kind in row["kinds"]})  # type: ignore[attr-defined]
    lines += ["", "| model | mode | " + " | ".join(kinds) + " |", "|---|---|" + "---:|" * len(kinds)]
    for row in rows:
        by_kind = row["kinds"]
        assert isinstance(by_kind, dict)
        cells = [f"{by_kind[k]['predicted_ms']:.2f}/{by_kind[k]['measured_ms']:.2f} ({by_kind[k]['error']:+.0%})"
                 if k in by_kind else "" for k in kinds]
        lines.append(f"| {row['model']} | {row['mode']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Action kinds: mean ms predicted/measured (signed error); target: every kind within ±25%.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default: 40)")
    parser.add_argument("--trains", type=int, default=3, help="trainings of each plan, the median kept (default: 3)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--modes", nargs="+", choices=["uncalibrated", "calibrated"],
                        default=["uncalibrated", "calibrated"])
    parser.add_argument("--quick", action="store_true", help="mlp-digits uncalibrated, 8 steps: a smoke run")
    args = parser.parse_args()
    models, modes, steps, trains = (["mlp-digits"], ["uncalibrated"], 8, 1) if args.quick else (
        args.models, args.modes, args.steps, args.trains)
    shutil.rmtree(args.out / "cache", ignore_errors=True)
    _environment["PIPETRAIN_CACHE_DIR"] = str((args.out / "cache").resolve())
    rows = []
    for mode in modes:
        for name in models:
            print(f"{name}, {mode} ...", flush=True)
            row = _flow(name, MODELS[name], mode, args.out / name.replace(" ", "-") / mode, steps, trains)
            print(f"  plans {row['plans']}; predicted {row['predicted_ms']:.2f} ms, measured "
                  f"{row['measured_ms']:.2f} ms ({row['iteration_error']:+.1%}; runs {row['measured_runs_ms']})",
                  flush=True)
            rows.append(row)
            write_atomic(args.out / "results.json", json.dumps(rows, indent=1))
    write_atomic(args.out / "table.md", _tables(rows))
    print(_tables(rows))


if __name__ == "__main__":
    main()
