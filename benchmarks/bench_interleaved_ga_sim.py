"""interleaved-ga (per-virtual-stage micro-batches) against the best equal interleaved plan, simulated.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved_ga_sim.py --out benchmarks/results/interleaved-ga-sim

The networks, clusters and estimated V100 profiles of :mod:`bench_zb1_ga_sim` (BENCHMARKS.md "UMPIPE
(a)"). For each network and cluster, the ``interleaved`` planner's plan (Megatron's interleaved 1F1B,
Narayanan et al. SC'21: chunk and micro-batch counts searched, equal micro-batches), then
``interleaved-ga`` on its stages: each virtual stage its own partition (UMPIPE's per-stage sizes,
Zhou et al. TPDS 2025), ordered by :mod:`pipetrain.schedule.interleaved_unequal`. Times are the
event simulator's; memory is not capped. The GA is seeded with every equal count, so part of a gain
can be an equal count the interleaved planner's thinned search skipped: the last column says
whether the stages' partitions really differ.

Output under ``--out``: ``interleaved_ga_sim.json`` and ``interleaved_ga_sim.md``.
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
from bench_zb1_ga_sim import CLUSTER_NAMES

from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.microbatch.ga import GAConfig, interleaved_ga
from pipetrain.planners.microbatch.uedp import with_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables


@dataclass(frozen=True)
class Result:
    """One network on one cluster: the equal interleaved plan against interleaved-ga's."""

    network: str
    cluster: str
    ranks: int
    chunks: int
    equal_s: float
    ga_s: float
    search_s: float
    equal_micro: int
    ga_micro: list[int]
    unequal: bool

    @property
    def gain(self) -> float:
        return self.equal_s / self.ga_s


def run_one(network: str, cluster_name: str, config: GAConfig, seed: int) -> Result:
    """The equal interleaved plan and interleaved-ga's, event-simulated."""
    graph = build(network)
    cost = CostModel(estimate_profile(graph, "v100", BATCH), cluster_of(cluster_name))
    planned = plan_interleaved(PlanningProblem(ModelRef.of(graph), cost, BATCH))
    base, cost = planned.plan, cost.on(planned.cluster)
    t0 = time.perf_counter()
    result = interleaved_ga(StageTables.from_plan(base, cost), base.n_ranks, seed=seed, config=config)
    search_s = time.perf_counter() - t0
    plan = with_sizes(base, result)
    equal_s, ga_s = (simulate(build_schedule(p), p, cost).iteration_s for p in (base, plan))
    return Result(network, cluster_name, base.n_ranks, base.virtual_stages, equal_s, ga_s, search_s,
                  len(base.stages[0].forward_sizes), [len(s.forward_sizes) for s in plan.stages],
                  len({s.forward_sizes for s in plan.stages}) > 1)


def report(rows: list[Result], seconds: float, argv: str) -> str:
    lines = ["| network | cluster | ranks × chunks | equal interleaved ms (m) | interleaved-ga ms | speed-up | "
             "interleaved-ga micro-batches per stage | stages differ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        counts, differ = "/".join(map(str, r.ga_micro)), "yes" if r.unequal else "no"
        lines.append(f"| {r.network} | {r.cluster} | {r.ranks} × {r.chunks} | {1e3 * r.equal_s:.2f} ({r.equal_micro}) "
                     f"| {1e3 * r.ga_s:.2f} | {r.gain:.3f}× | {counts} | {differ} |")
    for cluster in sorted({r.cluster for r in rows}):
        gains = [r.gain for r in rows if r.cluster == cluster]
        lines.append(f"\n- {cluster}: median {statistics.median(gains):.3f}×, max {max(gains):.3f}×")
    lines.append(f"\nCommand: `PYTHONPATH=. .venv/bin/python benchmarks/bench_interleaved_ga_sim.py {argv}`; "
                 f"{seconds:.0f} s in all.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/interleaved-ga-sim"))
    parser.add_argument("--quick", action="store_true", help="2 networks, 4 V100s, a tiny GA")
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--generations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = GAConfig(population=8, generations=4) if args.quick else GAConfig(args.population, args.generations)
    start, rows = time.perf_counter(), list[Result]()
    for cluster in CLUSTER_NAMES[:1] if args.quick else CLUSTER_NAMES:
        for network in networks(args.quick):
            rows.append(run_one(network, cluster, config, args.seed))
            print(f"{network} {cluster}: {rows[-1].gain:.3f}×", flush=True)
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "interleaved_ga_sim.json", json.dumps([asdict(r) for r in rows], indent=1))
    text = report(rows, seconds, " ".join(sys.argv[1:] if argv is None else argv))
    write_atomic(args.out / "interleaved_ga_sim.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
