"""Two checkouts of pipetrain, one plan each setting, trained alternately: does a change slow the runtime?

    git worktree add /tmp/before <commit>
    PYTHONPATH=. .venv/bin/python benchmarks/bench_checkouts.py --before /tmp/before --after . \\
        --rounds 4 --out benchmarks/results/checkouts

Each setting (``model batch method[:chunks]@m steps``, as :mod:`diag_actions` plans it on this
machine's default 2-rank cluster; ``+recompute`` recomputes every stage, method ``pipedream`` runs
the 1f1b plan asynchronously, ``local`` with the model's default heads) is planned once, by this
checkout, from one profile, and saved as a plan file; each round trains it once under each checkout
(a fresh process whose ``PYTHONPATH`` is that checkout, one thread per rank), the two back to back
and their order alternating between rounds. Only the public surface both checkouts share is used:
``Plan.from_json``, ``pipetrain.runtime.train``, the zoo. Reported: per setting the median step of
each checkout and the median of the paired ratios (after / before).

Output under ``--out``: ``plan_<n>.json`` and ``profile_<model>_<batch>.json`` (what ran),
``checkouts.json`` (every run) and ``checkouts.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diag_actions import build_plan, parse_setting

from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.aux_heads import default_aux
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile

SETTINGS = ("mlp 128 1f1b@2 30", "mlp 128 zb1@2 30", "mlp 128 interleaved-zb:2@2 30", "mlp 128 zbv@2 30",
            "gpt-tiny 64 1f1b@4 60", "gpt-tiny 64 zb1@8 60", "gpt-tiny 64 interleaved@8 60", "gpt-tiny 64 zbv@8 60",
            "gpt-tiny 64 gpipe+recompute@4 60", "gpt-tiny 64 pipedream@4 60", "mlp-digits 64 local@4 60")
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


def setting_plan(setting: str, out: Path) -> Plan:
    """The plan of ``setting``, from the model's profile (saved under ``out`` on first use)."""
    model, batch, spec, _ = setting.split()
    path = out / f"profile_{model}_{batch}.json"
    graph = build_model(model)
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(api.profile_model(graph, int(batch)).to_json())
    cost = CostModel(Profile.from_json(path.read_text()), api.local_cluster(2))
    name, _, micro = spec.partition("@")
    name, recompute = name.removesuffix("+recompute"), name.endswith("+recompute")
    asynchronous = name in (Method.PIPEDREAM.value, Method.LOCAL.value)
    _, method, chunks, m = parse_setting(f"{Method.ONE_F_ONE_B.value if asynchronous else name}@{micro}")
    plan = build_plan(graph, cost, int(batch), method, chunks, m).with_recompute(None if recompute else ())
    if name == Method.LOCAL.value:
        return replace(plan, method=Method.LOCAL, weights=WeightPolicy.LOCAL, params=LocalParams(default_aux(graph)))
    return plan.run_by(Method(name)) if asynchronous else plan


def plan_text(plan: Plan) -> str:
    """The plan's JSON, with a local plan's parameters also at the top level, where checkouts from
    before ``params`` read them (newer ones read ``params`` and ignore those)."""
    data = json.loads(plan.to_json())
    data.update(data.get("params", {}) if plan.method is Method.LOCAL else {})
    return json.dumps(data, indent=2)


def measure(checkout: Path, plan_file: Path, steps: str) -> float:
    """Median seconds per step of one run of ``plan_file`` under ``checkout``, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    done = subprocess.run([sys.executable, "-c", RUNNER, str(plan_file.resolve()), steps], env=env, check=True,
                          capture_output=True, text=True, cwd=checkout)
    return float(done.stdout.strip().splitlines()[-1])


def report(runs: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| setting | before ms | after ms | after / before (median of pairs) | pairs |",
             "|---|---:|---:|---:|---|"]
    for setting, by in runs.items():
        ratios = [a / b for b, a in zip(by["before"], by["after"], strict=True)]
        lines.append(f"| {setting} | {statistics.median(by['before']) * 1e3:.2f} | "
                     f"{statistics.median(by['after']) * 1e3:.2f} | {statistics.median(ratios):.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in ratios)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before the change")
    parser.add_argument("--after", type=Path, default=Path("."), help="checkout of the code after it (default: .)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/checkouts"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS))
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    files = {}
    for n, setting in enumerate(args.settings):
        files[setting] = args.out / f"plan_{n}.json"
        files[setting].write_text(plan_text(setting_plan(setting, args.out)))
    runs: dict[str, dict[str, list[float]]] = {s: {c: [] for c in CHECKOUTS} for s in args.settings}
    for r in range(args.rounds):
        for setting in args.settings:
            for checkout in CHECKOUTS if r % 2 == 0 else CHECKOUTS[::-1]:
                runs[setting][checkout].append(measure(trees[checkout], files[setting], setting.split()[-1]))
                print(f"round {r} {setting} {checkout}: {runs[setting][checkout][-1] * 1e3:.2f} ms", flush=True)
        (args.out / "checkouts.json").write_text(json.dumps(runs, indent=2))
    text = report(runs)
    (args.out / "checkouts.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
