"""Two checkouts of pipetrain, one plan each setting, trained alternately: does a change slow the runtime?

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/bench_checkouts.py --before /tmp/before            # 11 settings, 4 rounds
    .venv/bin/python benchmarks/bench_checkouts.py --quick                          # this checkout against itself

Each setting (``model batch method[:chunks]@m steps``, planned as :mod:`common.core_plans` plans it on
this machine's default 2-rank cluster; ``+recompute`` recomputes every stage, method ``pipedream``
runs the 1f1b plan asynchronously, ``local`` with the model's default heads) is planned once, by this
checkout, from one profile, and saved as a plan file; each round trains it once under each checkout
(a fresh process whose ``PYTHONPATH`` is that checkout, one thread per rank), the two back to back
and their order alternating between rounds. Only the public surface both checkouts share is used:
``Plan.from_json``, ``pipetrain.runtime.train``, the zoo. Reported: per setting the median step of
each checkout and the median of the paired ratios (after / before). Without ``--before`` both sides
are this checkout: the ratios then measure the noise floor of the comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.core_checkouts import plan_text, setting_plan
from harness import Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain.fileio import write_atomic

SETTINGS = ("mlp 128 1f1b@2 30", "mlp 128 zb1@2 30", "mlp 128 interleaved-zb:2@2 30", "mlp 128 zbv@2 30",
            "gpt-tiny 64 1f1b@4 60", "gpt-tiny 64 zb1@8 60", "gpt-tiny 64 interleaved@8 60", "gpt-tiny 64 zbv@8 60",
            "gpt-tiny 64 gpipe+recompute@4 60", "gpt-tiny 64 pipedream@4 60", "mlp-digits 64 local@4 60")
QUICK = ("gpt-tiny 16 1f1b@2 6",)
CHECKOUTS = ("before", "after")
RUNNER = """
import statistics, sys
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, train
plan = Plan.from_json(open(sys.argv[1]).read())
config = TrainConfig(steps=int(sys.argv[2]), warmup_steps=2, progress=False, threads_per_rank=1, timeout_s=180.0)
print(statistics.median(train(build_model(plan.model), plan, config).step_times_s))
"""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--before", type=Path, default=Path("."),
                   help="checkout of the code before the change (default: this one, an A/A run)")
    p.add_argument("--after", type=Path, default=Path("."), help="checkout of the code after it (default: this one)")
    p.add_argument("--settings", nargs="+", help="settings to run (default: 11 of mlp, gpt-tiny and mlp-digits)")


def settings(ctx: Context) -> list[tuple[str, Path]]:
    """Each setting and its saved plan (planned here, once, from the model's profile)."""
    chosen = ctx.args.settings or (QUICK if ctx.quick else SETTINGS)
    out = []
    for n, setting in enumerate(chosen):
        path = ctx.artifact(f"plan_{n}.json")
        write_atomic(path, plan_text(setting_plan(setting, ctx.artifacts)))
        out.append((setting, path))
    return out


def _measure(checkout: Path, plan_file: Path, steps: str) -> float:
    """Median seconds per step of one run of ``plan_file`` under ``checkout``, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    done = subprocess.run([sys.executable, "-c", RUNNER, str(plan_file.resolve()), steps], env=env, check=True,
                          capture_output=True, text=True, cwd=checkout)
    return float(done.stdout.strip().splitlines()[-1])


def run(setting: tuple[str, Path], ctx: Context) -> list[Row]:
    """Both checkouts back to back, the first of them alternating by round."""
    text, plan_file = setting
    trees = {"before": ctx.args.before, "after": ctx.args.after}
    order = CHECKOUTS if ctx.round % 2 == 0 else CHECKOUTS[::-1]
    return [{"setting": text, "checkout": c, "step_s": _measure(trees[c], plan_file, text.split()[-1])} for c in order]


def report(rows: list[Row], info: RunInfo) -> Report:
    lines = ["| setting | before ms | after ms | after / before (median of pairs) | pairs |",
             "|---|---:|---:|---:|---|"]
    medians = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        by = {c: {r["round"]: r["step_s"] for r in rows if r["setting"] == setting and r["checkout"] == c}
              for c in CHECKOUTS}
        ratios = [by["after"][k] / by["before"][k] for k in sorted(by["before"]) if k in by["after"]]
        if not ratios:
            continue
        medians.append(statistics.median(ratios))
        lines.append(f"| {setting} | {statistics.median(by['before'].values()) * 1e3:.2f} | "
                     f"{statistics.median(by['after'].values()) * 1e3:.2f} | {medians[-1]:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in ratios)} |")
    sides = f"before {info.options.get('before', '?')}, after {info.options.get('after', '?')}"
    return Report("\n".join(lines), (Headline(
        "methods", "runtime after a change / before it: step time, median over settings",
        statistics.median(medians) if medians else None, config=f"measured, 2 CPU ranks, {len(medians)} settings; "
        f"{sides}"),))


EXPERIMENT = Experiment(name="checkouts", title="Runtime before and after a change: two checkouts, paired",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=4)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
