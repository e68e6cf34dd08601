"""The runtime's cost per action: calibrated, and measured action by action, on the mlp and gpt-tiny.

    .venv/bin/python benchmarks/bench_action_cost.py                              # this checkout
    .venv/bin/python benchmarks/bench_action_cost.py --base /tmp/base-action      # beside another one
    .venv/bin/python benchmarks/bench_action_cost.py --quick                      # gpt-tiny at batch 16

Issue 30 item 2. Calibration (:mod:`pipetrain.calibrate.fit`) prices the runtime's own work at
``overhead_s`` per F, B, W or STEP action, fitted with the compute speed to two runs of the model
(``1f1b`` m=1, ``zbv`` m=8); the Core run of 2026-11-28 fitted 2,993 µs on the 8×(1024-4096-1024)
mlp at batch 128 and 499 µs on gpt-tiny. Per model and checkout (this one; ``--base``: another,
run by the same script, :mod:`common.action_cost`), each round profiles the model, runs the two
calibration plans (2 runs of 10 timed steps each, 2 ranks, one thread per rank) and fits the terms;
from the zbv run it also takes each compute action's mean measured seconds beside the profile's
seconds for the same action, so the excess per action is seen where it is spent. Rounds alternate
the checkouts (the harness starts each round one setting later).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.action_cost import COMPUTE_KINDS
from harness import Context, Experiment, Headline, Report, Row, RunInfo, main

HERE = Path(__file__).resolve().parent
MODELS = (("mlp", 128), ("gpt-tiny", 64))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", type=Path, help="another checkout of pipetrain (e.g. a git worktree of the base "
                                             "commit) to run beside this one, alternately")
    p.add_argument("--models", default=",".join(m for m, _ in MODELS),
                   help="comma-separated models among mlp, gpt-tiny (default both)")


def settings(ctx: Context) -> list[tuple[str, int, str]]:
    sides = ["this"] + (["base"] if ctx.args.base else [])
    if ctx.quick:
        return [("gpt-tiny", 16, side) for side in sides]
    wanted = ctx.args.models.split(",")
    return [(model, batch, side) for model, batch in MODELS if model in wanted for side in sides]


def run(setting: tuple[str, int, str], ctx: Context) -> list[Row]:
    model, batch, side = setting
    checkout = HERE.parent if side == "this" else ctx.args.base.resolve()
    steps, runs = (4, 1) if ctx.quick else (10, 2)
    command = [sys.executable, str(HERE / "common" / "action_cost.py"), "--model", model, "--batch", str(batch),
               "--runs", str(runs), "--steps", str(steps)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{side} {model}: exit {out.returncode}\n{out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    ctx.log(f"[{side} {model}] {row['overhead_s'] * 1e6:.0f} µs per action, speed {row['speed']:.3f}")
    return [{"side": side, **row}]


def _median(rows: list[Row], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _kind_median(rows: list[Row], table: str, kind: str) -> float | None:
    values = [r[table][kind][1] for r in rows if kind in r[table]]
    return statistics.median(values) if values else None


def report(rows: list[Row], info: RunInfo) -> Report:
    text = ["| model | checkout | rounds | µs per action (calibrated) | speed | iterations measured (ms) |",
            "|---|---|---:|---:|---:|---|"]
    kinds = ["", "| model | checkout | action | count per step | measured ms | profile ms | excess µs |",
             "|---|---|---|---:|---:|---:|---:|"]
    headlines = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["side"]), []).append(r)
    for (model, side), mine in groups.items():
        overhead = _median(mine, "overhead_s")
        iterations = ", ".join(f"{s} {statistics.median(r['measured_s'][i] for r in mine) * 1e3:.1f}"
                               for i, s in enumerate(mine[0]["settings"]))
        text.append(f"| {model} b={mine[0]['batch']} | {side} | {len(mine)} | {overhead * 1e6:.0f} | "
                    f"{_median(mine, 'speed'):.3f} | {iterations} |")
        for kind in COMPUTE_KINDS:
            measured, profiled = (_kind_median(mine, t, kind) for t in ("measured_per_action", "profiled_per_action"))
            if measured is None or profiled is None:
                continue
            count = mine[0]["measured_per_action"][kind][0]
            kinds.append(f"| {model} | {side} | {kind} | {count} | {measured * 1e3:.2f} | {profiled * 1e3:.2f} | "
                         f"{(measured - profiled) * 1e6:.0f} |")
        headlines.append(Headline("methods", f"calibrated runtime cost per action, {model} ({side})",
                                  round(overhead * 1e6), unit="µs",
                                  config=f"measured, 2 CPU ranks, 1 thread each, batch {mine[0]['batch']}"))
    for model in dict.fromkeys(m for m, _ in groups):
        if (model, "base") not in groups:
            continue
        this, base = groups[model, "this"], groups[model, "base"]
        ratios = {"calibrated cost per action": (_median(this, "overhead_s"), _median(base, "overhead_s")),
                  f"{this[0]['settings'][-1]} iteration": (statistics.median(r["measured_s"][-1] for r in this),
                                                           statistics.median(r["measured_s"][-1] for r in base))}
        for kind in COMPUTE_KINDS:
            after, before = (_kind_median(rs, "measured_per_action", kind) for rs in (this, base))
            if after is not None and before is not None:
                ratios[f"measured {kind} action"] = (after, before)
        headlines += [Headline("methods", f"{what}, this / base checkout, {model}",  # None: base fitted 0
                               after / before if before > 0 else None, config="same script, checkouts alternated")
                      for what, (after, before) in ratios.items()]
    note = ("Per action kind: the mean seconds of one action in the median step of the zbv run with the median "
            "iteration, beside the profile's seconds for the same action (speed 1, no overhead); medians over rounds.")
    return Report("\n".join(text + kinds + ["", note]), tuple(headlines))


EXPERIMENT = Experiment(name="action-cost", title="The runtime's cost per action: calibrated and measured",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=2)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
