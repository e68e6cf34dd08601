"""PipeDream's asynchronous planner on the paper's clusters A and B, beside the paper's Table 1 figures.

    .venv/bin/python benchmarks/bench_pipedream_paper.py --out benchmarks/results/partition-sim-paper
    .venv/bin/python benchmarks/bench_pipedream_paper.py --quick --out /tmp/pd-paper     # vgg16 on A only

PipeDream (Narayanan et al., SOSP'19) reports its plans' speed-up over data parallelism on two V100
clusters: ``A``, 4 servers of 4 V100s on PCIe with 10 Gb/s between servers, and ``B``, 2 servers of 8
V100s on NVLink with 25 Gb/s between them. Both are cluster files shipped in ``examples/clusters/``
(``pipedream-a.yaml``, ``pipedream-b.yaml``; their link rates are our assumptions). Models from the
zoo: ``vgg16``, ``gnmt`` (8 + 8 LSTM layers: GNMT-16) and ``resnet50``; profiles *estimated* for a
V100 (:mod:`pipetrain.profile.estimate`); every time is the event simulator's steady state.

* per-GPU batch 64 for all three models (PAPERS.md gives no per-GPU batch; issue 29 quotes the
  ResNet-50 figure at 64 per GPU), ``B = 64 · 16 = 1024``;
* ``pipedream``: ``plan --planner pipedream --method pipedream`` (docs/algorithms.md §3.6): the DP with
  the paper's objective on the hierarchy and flat, its straight pipeline and plain data parallelism,
  each run by ``pipedream`` (1F1B-RR) over micro-batch counts ``m`` with 32 to 128 samples per
  micro-batch (the per-GPU mini-batch near the paper's 64), scored by the steady state (seconds per
  batch once the pipeline is full);
* ``straight``: the fastest of those candidates that replicates no stage (PipeDream's straight
  pipeline);
* ``data parallel``: the same planner's data-parallel candidate at ``m = 16`` (one stage on all 16
  devices, one 64-sample micro-batch each, one all-reduce per step: PipeDream's config ``16``),
  priced by the same steady state;
* speed-up: data parallel's seconds per batch over pipedream's;
* ``per server``: a plan the planner does not propose, for reference: one stage per server, each
  on all its server's devices, the layers cut to balance their compute
  (:func:`~pipetrain.planners.partition.balanced.balanced_partition`), ``m = 16``, run by
  ``pipedream`` and priced by the same steady state;
* compute floor: one GPU's forward + backward of its 64 samples (the batch's compute spread evenly,
  nothing else): no plan beats it, so ``data parallel / floor`` bounds any plan's speed-up over data
  parallelism on these devices and links.

Output under ``--out``: ``pipedream_paper.json`` and ``pipedream_paper.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipetrain.cluster_spec import load_cluster_spec
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.counts import thinned_counts
from pipetrain.planners.partition.balanced import balanced_partition
from pipetrain.planners.pipedream import PipeDreamReport, plan_pipedream
from pipetrain.planners.score import score_steady
from pipetrain.profile.estimate import estimate_profile

CLUSTERS = {"A 4x4": "pipedream-a.yaml", "B 2x8": "pipedream-b.yaml"}
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"
MODELS = ("vgg16", "gnmt", "resnet50")
PER_GPU = 64
# The paper's speed-ups over data parallelism (its Table 1) as PAPERS.md §2 and issue 29 quote them;
# None where neither gives the figure.
PAPER: dict[tuple[str, str], str | None] = {
    ("vgg16", "A 4x4"): "5.28× (15-1)", ("vgg16", "B 2x8"): None,
    ("gnmt", "A 4x4"): "2.34×", ("gnmt", "B 2x8"): "3.14×",
    ("resnet50", "A 4x4"): "1× (data parallel)", ("resnet50", "B 2x8"): "1× (data parallel)",
}


@dataclass(frozen=True)
class Row:
    model: str
    cluster: str
    batch: int
    dp_batch_s: float
    pipedream_batch_s: float
    straight_batch_s: float
    per_server_batch_s: float
    config: str
    n_micro: int
    speedup: float
    floor_s: float
    paper: str | None
    planner_s: float


def per_server(problem: PlanningProblem) -> float:
    """Steady-state seconds per batch of one stage per server on all its devices, layers balanced by
    compute, ``m`` = the device count (module docstring)."""
    cost, names = problem.cost, problem.layer_names
    nodes = sorted({d.node for d in cost.cluster.devices})
    ranks = [tuple(r for r, d in enumerate(cost.cluster.devices) if d.node == n) for n in nodes]
    m = cost.cluster.n_devices
    b = problem.batch_size // m
    sizes, stages, first = equal_sizes(problem.batch_size, m), [], 0
    for count, on in zip(balanced_partition([cost.layer_work_s(n, b, 0) for n in names], len(nodes)), ranks,
                         strict=True):
        stages.append(StagePlan(tuple(names[first:first + count]), on, sizes, sizes))
        first += count
    model = problem.model
    plan = Plan(model.name, model.fingerprint, problem.batch_size, Method.PIPEDREAM, tuple(stages))
    return score_steady(plan.run_by(Method.PIPEDREAM), cost).iteration_s


def row(model: str, cluster_name: str) -> Row:
    """The planner's answer and its data-parallel candidate for ``model`` on one of :data:`CLUSTERS`."""
    cluster = load_cluster_spec(EXAMPLES / CLUSTERS[cluster_name]).cluster
    graph, devices = build_model(model), cluster.n_devices
    batch = PER_GPU * devices
    cost = CostModel(estimate_profile(graph, "v100", batch_size=batch), cluster)
    problem = PlanningProblem(ModelRef.of(graph), cost, batch, constraints=Constraints(method=Method.PIPEDREAM))
    counts = [m for m in thinned_counts(batch) if 32 <= batch // m <= 128]
    start = time.perf_counter()
    result = plan_pipedream(problem, counts=counts)
    planner_s = time.perf_counter() - start
    assert isinstance(result.report, PipeDreamReport)
    dp = next(c for c in result.candidates
              if c.label == f"pipedream {devices}" and len(c.plan.stages[0].forward_sizes) == devices)
    best = result.candidates[0]
    layers = tuple(graph.names)
    floor_s = cost.forward_s(layers, PER_GPU, 0) + cost.backward_s(layers, PER_GPU, 0)
    straight = min(c.iteration_s for c in result.candidates if not c.plan.replicated)
    return Row(model, cluster_name, batch, dp.iteration_s, best.iteration_s, straight, per_server(problem),
               result.report.config,
               len(best.plan.stages[0].forward_sizes), dp.iteration_s / best.iteration_s, floor_s,
               PAPER[(model, cluster_name)], planner_s)


def report(rows: list[Row], seconds: float, command: str) -> str:
    """The Markdown table of ``pipedream_paper.md``."""
    lines = ["# PipeDream's planner on the paper's clusters (simulated, V100 device model)", "",
             f"`{command}` on {platform.node() or 'this machine'} ({platform.machine()}), {seconds:.0f} s. "
             "Profiles estimated for a V100; clusters `examples/clusters/pipedream-{a,b}.yaml`; steady-state "
             f"seconds per batch of {PER_GPU} samples per GPU.", "",
             "| model | cluster | data parallel (s) | pipedream (s) | config | m | ours: speed-up over DP | paper "
             "| straight (s) | straight over DP | per server (s) | per server over DP | compute floor (s) "
             "| bound: DP / floor | planner (s) |", "|---" * 15 + "|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.cluster} | {r.dp_batch_s:.3f} | {r.pipedream_batch_s:.3f} | {r.config} | "
                     f"{r.n_micro} | {r.speedup:.2f}× | {r.paper or 'not in PAPERS.md'} | {r.straight_batch_s:.3f} | "
                     f"{r.dp_batch_s / r.straight_batch_s:.2f}× | {r.per_server_batch_s:.3f} | "
                     f"{r.dp_batch_s / r.per_server_batch_s:.2f}× | {r.floor_s:.3f} | "
                     f"{r.dp_batch_s / r.floor_s:.2f}× | {r.planner_s:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/partition-sim-paper"))
    parser.add_argument("--quick", action="store_true", help="vgg16 on cluster A only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [("vgg16", "A 4x4")] if args.quick else [(m, c) for m in MODELS for c in CLUSTERS]
    rows: list[Row] = []
    start = time.perf_counter()
    for model, cluster_name in cases:
        rows.append(row(model, cluster_name))
        r = rows[-1]
        print(f"{model:9s} {cluster_name}: DP {r.dp_batch_s:.3f} s, pipedream {r.pipedream_batch_s:.3f} s "
              f"({r.config}, m={r.n_micro}): {r.speedup:.2f}× (paper {r.paper}), {r.planner_s:.0f} s", flush=True)
        write_atomic(args.out / "pipedream_paper.json", json.dumps([asdict(x) for x in rows], indent=1))
    command = f".venv/bin/python benchmarks/bench_pipedream_paper.py{' --quick' if args.quick else ''} --out {args.out}"
    write_atomic(args.out / "pipedream_paper.md", report(rows, time.perf_counter() - start, command))
    print(f"wrote {args.out}/pipedream_paper.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
