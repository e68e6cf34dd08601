"""Pre-posting a step's receives (gloo): the runtime as it is (as many as fit
:data:`~pipetrain.schedule.prepost.PREPOST_BYTES` at the step's start) against the old behaviour
(:data:`~pipetrain.schedule.prepost.PREPOSTED` per channel, the next posted as each is taken).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_prepost.py --rounds 4 --out benchmarks/results/prepost

Each model is profiled once (saved under ``--out``); each setting (``model batch method[:chunks]@m
steps``, planned as :mod:`diag_actions` does, on this machine's default 2-rank cluster) trains once
per round in each mode, the two modes back to back and their order alternating between rounds;
each run is a fresh process (the ranks are spawned processes, which read the mode from the
environment as they import this file), one thread per rank.
Reported: per setting the median step of each mode and the median of the paired ratios.

Output under ``--out``: ``prepost.json`` (every run) and ``prepost.md``.
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

from diag_actions import build_plan, parse_setting

import pipetrain.schedule.prepost as prepost
from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, train

if os.environ.get("PIPETRAIN_BENCH_PREPOST") == "old":  # read again in every spawned rank
    setattr(prepost, "PREPOST_BYTES", 0)  # the budget prepost_budget gives gloo  # noqa: B010

SETTINGS = ("mlp 128 interleaved-zb:4@2 30", "mlp 128 zbv@2 30", "gpt-tiny 64 interleaved@8 60",
            "gpt-tiny 64 zbv@8 60", "gpt-tiny 64 1f1b@4 60", "gpt-tiny 64 zb1@8 60")
MODES = ("old", "new")


def profile_path(out: Path, setting: str) -> Path:
    """Where the profile of ``setting``'s model at its batch is saved, made on first use."""
    model, batch = setting.split()[:2]
    path = out / f"profile_{model}_{batch}.json"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(api.profile_model(build_model(model), int(batch)).to_json())
    return path


def run_one(setting: str, profile: Path) -> float:
    """Median seconds per step of one training run of ``setting`` in this process's mode."""
    model, batch, spec, steps = setting.split()
    graph = build_model(model)
    cost = CostModel(Profile.from_json(profile.read_text()), api.local_cluster(2))
    _, method, chunks, m = parse_setting(spec)
    plan = build_plan(graph, cost, int(batch), method, chunks, m)
    config = TrainConfig(steps=int(steps), warmup_steps=2, progress=False, threads_per_rank=1, timeout_s=120.0)
    return statistics.median(train(graph, plan, config).step_times_s)


def measure(setting: str, mode: str, profile: Path) -> float:
    """One run of ``setting`` in ``mode``, in a fresh process."""
    env = dict(os.environ, PIPETRAIN_BENCH_PREPOST=mode)
    out = subprocess.run([sys.executable, __file__, "--one", setting, "--profile", str(profile)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/prepost"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(run_one(args.one, args.profile))
        return
    profiles = {s: profile_path(args.out, s) for s in args.settings}
    runs: dict[str, dict[str, list[float]]] = {s: {mode: [] for mode in MODES} for s in args.settings}
    for r in range(args.rounds):
        for setting in args.settings:
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                runs[setting][mode].append(measure(setting, mode, profiles[setting]))
                print(f"round {r} {setting} {mode}: {runs[setting][mode][-1] * 1e3:.2f} ms", flush=True)
    text = ["| setting | old ms | new ms | new / old (median of pairs) | pairs |", "|---|---:|---:|---:|---|"]
    for setting, by_mode in runs.items():
        ratios = [n / o for o, n in zip(by_mode["old"], by_mode["new"], strict=True)]
        text.append(f"| {setting} | {statistics.median(by_mode['old']) * 1e3:.2f} | "
                    f"{statistics.median(by_mode['new']) * 1e3:.2f} | {statistics.median(ratios):.3f} | "
                    f"{', '.join(f'{x:.3f}' for x in ratios)} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prepost.json").write_text(json.dumps(runs, indent=2))
    (args.out / "prepost.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
