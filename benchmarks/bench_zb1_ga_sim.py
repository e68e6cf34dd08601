"""zb1-ga (unequal micro-batches under ZB-H1) against the best equal zb1 plan, simulated on V100s.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_zb1_ga_sim.py --out benchmarks/results/zb1-ga-sim
    PYTHONPATH=. .venv/bin/python benchmarks/bench_zb1_ga_sim.py --quick --out /tmp/zb1-ga-sim   # smoke run

The networks and clusters of BENCHMARKS.md "UMPIPE (a)" (:mod:`bench_umpipe_sim`: gpt1-14, vgg16,
synthetic 0-9 at 8 layers and width 8; batch 64; one stage per device; profiles *estimated* for the
V100 device model, with the backward's weight-gradient share traced per layer) on 4 and 8 V100s.
For each network and cluster:

* ``zb1`` and ``1f1b``: the best equal plan of each method (the balanced planner: exact min-max
  layer split, every micro-batch count up to 64 and the powers of two simulated);
* ``zb1-ga`` on the zb1 plan's stages: per-stage unequal sizes under the ZB-H1 order (Zero Bubble,
  Qi et al., ICLR 2024; UMPIPE's per-stage partitions, Zhou et al., TPDS 2025), forward = backward;
* ``1f1b-ga`` on the 1f1b plan's stages: the same under the 1F1B order.

Every reported time is the **event simulator's** iteration time of the final plan (the GA's own
score agrees to 1e-9, tests/unit/test_zb1_ga.py). Memory is not capped; the peak activation bytes of
the busiest rank are reported beside the times, since ZB-H1 holds more than 1F1B on later stages.

Output under ``--out``: ``zb1_ga_sim.json`` (every result) and ``zb1_ga_sim.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_umpipe_sim import BATCH, build, cluster_of, networks

from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.microbatch.ga import GAConfig, one_f_one_b_ga, zb1_ga
from pipetrain.planners.microbatch.uedp import with_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables

CLUSTER_NAMES = ("4xV100", "8xV100")
PLANS = ("1f1b", "zb1", "1f1b-ga", "zb1-ga")


@dataclass(frozen=True)
class Result:
    """One network on one cluster: per plan, event-simulated seconds, the busiest rank's peak
    activation bytes and micro-batch sizes per stage; per GA, its search seconds."""

    network: str
    cluster: str
    times_s: dict[str, float]
    peak_bytes: dict[str, int]
    sizes: dict[str, list[list[int]]]
    search_s: dict[str, float]


def run_one(network: str, cluster_name: str, config: GAConfig, seed: int) -> Result:
    graph = build(network)
    cluster = cluster_of(cluster_name)
    cost = CostModel(estimate_profile(graph, "v100", BATCH), cluster)
    plans: dict[str, Plan] = {}
    search: dict[str, float] = {}
    for method, ga in ((Method.ONE_F_ONE_B, one_f_one_b_ga), (Method.ZB1, zb1_ga)):
        constraints = Constraints(method=method, n_stages=cluster.n_devices)
        base = plan_balanced(PlanningProblem(ModelRef.of(graph), cost, BATCH, constraints=constraints)).plan
        t0 = time.perf_counter()
        result = ga(StageTables.from_plan(base, cost), seed=seed, config=config)
        search[result.planner] = time.perf_counter() - t0
        plans[method.value], plans[result.planner] = base, with_sizes(base, result)
    timelines = {name: simulate(build_schedule(plan), plan, cost) for name, plan in plans.items()}
    return Result(network, cluster_name, {n: t.iteration_s for n, t in timelines.items()},
                  {n: max(t.peak_activation_bytes) for n, t in timelines.items()},
                  {n: [list(s.forward_sizes) for s in p.stages] for n, p in plans.items()}, search)


def speedup(r: Result, plan: str, baseline: str) -> float:
    return r.times_s[baseline] / r.times_s[plan]


def report(results: list[Result], seconds: float, argv: str) -> str:
    lines = [
        "| network | cluster | 1f1b ms | zb1 ms | 1f1b-ga ms | zb1-ga ms | zb1-ga / best equal zb1 | zb1-ga / 1f1b-ga "
        "| zb1-ga / best equal 1f1b | peak act. GiB zb1 / zb1-ga | zb1-ga micro-batches per stage |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ms = " | ".join(f"{1e3 * r.times_s[p]:.2f}" for p in PLANS)
        counts = "/".join(str(len(s)) for s in r.sizes["zb1-ga"])
        lines.append(f"| {r.network} | {r.cluster} | {ms} | {speedup(r, 'zb1-ga', 'zb1'):.3f}× | "
                     f"{speedup(r, 'zb1-ga', '1f1b-ga'):.3f}× | {speedup(r, 'zb1-ga', '1f1b'):.3f}× | "
                     f"{r.peak_bytes['zb1'] / 2**30:.2f} / {r.peak_bytes['zb1-ga'] / 2**30:.2f} | {counts} |")
    lines += ["", "Medians per cluster (zb1-ga over best equal zb1, over 1f1b-ga, over best equal 1f1b):", ""]
    for cluster in sorted({r.cluster for r in results}):
        rs = [r for r in results if r.cluster == cluster]
        med = [statistics.median(speedup(r, "zb1-ga", b) for r in rs) for b in ("zb1", "1f1b-ga", "1f1b")]
        lines.append(f"- {cluster}: " + ", ".join(f"{m:.3f}×" for m in med)
                     + f" (max over zb1: {max(speedup(r, 'zb1-ga', 'zb1') for r in rs):.3f}×)")
    lines += ["", f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/bench_zb1_ga_sim.py {argv}`; "
              f"{seconds:.0f} s in all."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/zb1-ga-sim"))
    parser.add_argument("--quick", action="store_true", help="2 networks, 4 V100s, a tiny GA")
    parser.add_argument("--population", type=int, default=48)
    parser.add_argument("--generations", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = GAConfig(population=8, generations=4) if args.quick else GAConfig(args.population, args.generations)
    start = time.perf_counter()
    results = []
    for cluster in CLUSTER_NAMES[:1] if args.quick else CLUSTER_NAMES:
        for network in networks(args.quick):
            results.append(run_one(network, cluster, config, args.seed))
            r = results[-1]
            print(f"{network} {cluster}: zb1-ga {speedup(r, 'zb1-ga', 'zb1'):.3f}× zb1, "
                  f"{speedup(r, 'zb1-ga', '1f1b-ga'):.3f}× 1f1b-ga ({sum(r.search_s.values()):.1f} s)", flush=True)
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "zb1_ga_sim.json", json.dumps([asdict(r) for r in results], indent=1))
    text = report(results, seconds, " ".join(sys.argv[1:] if argv is None else argv))
    write_atomic(args.out / "zb1_ga_sim.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
