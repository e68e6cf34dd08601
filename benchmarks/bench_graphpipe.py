"""GraphPipe (GPP, method ``graph``) against sequential pipelines (SPP): simulated at paper scale,
search time, and measured here on tiny branchy models.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --sim --out benchmarks/results/graphpipe
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --search --out benchmarks/results/graphpipe
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --measured --out benchmarks/results/graphpipe
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --sim --search --measured --quick --out /tmp/gp

1. ``--sim`` (simulated, paper scale): Summit-like clusters of 4, 8, 16, 32 V100s, 4 per node on
   NVLink (150 GB/s, 5 µs), nodes on EDR InfiniBand (100 Gbit/s = 12.5 GB/s, 5 µs); profiles
   *estimated* (:func:`~pipetrain.profile.estimate.estimate_profile`, the V100 roofline on the meta
   device). For ``mmt``, ``dlrm`` and ``candle-uno`` (zoo, GraphPipe App. A.2 sizes) at a mini-batch
   of ``--per-gpu`` samples per GPU (default 32: 128 on 4 GPUs ... 1024 on 32; the paper's sizes are
   not in our notes), it plans GPP (the ``graphpipe`` planner) and SPP (``pipedream``: PipeDream's
   DP with replication on the linearised model, gpipe or 1f1b, synchronous), and the ``balanced``
   chain planner up to ``--balanced-max`` GPUs (it gets slow and poor beyond). Throughput =
   batch / the event simulator's iteration time. Then the CANDLE-Uno branch sweep: 2, 4, 8, 16
   branches on ``--sweep-gpus`` GPUs (default 16; 0: none). ``--models`` and ``--gpus`` pick a subset
   (output ``sim-<models>.json``/``.md``); ``--precision`` the estimated profiles' (default fp16, the
   V100's tensor cores); ``pipedream-1f1b`` is the paper's baseline as we model it (PipeDream, 1F1B
   only). Every planner call records its wall and CPU seconds and the CPU seconds inside the simulator.
2. ``--search``: CPU time of the graphpipe planner and the PipeDream planner on the same problems,
   ``--repeats`` runs each, alternating, the median, on ``--search-gpus`` (default 8; part 1 records
   one run of each planner at every GPU count too).
3. ``--measured``: ``branchy-digits`` and ``mmt-tiny`` on 2 and 3 local ranks (gloo, one thread a
   rank): graphpipe's plan, a hand-made graph plan with the branches on their own stages, and the
   chain plans of the pipedream and balanced planners, all from one measured profile, trained
   ``--steps`` steps each in one :func:`~pipetrain.runtime.train.train_many` launch, the plans
   alternating (A B C D, then D C B A, ...) for ``--rounds`` rounds; the median samples/s beside the
   prediction (the event simulator on the measured profile and :func:`pipetrain.api.local_cluster`).

Output under ``--out``: ``sim.json``/``sim.md``, ``search.json``/``search.md``, ``measured.json``/``measured.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graphpipe_measured import measured_part

import pipetrain.planners.score as scoring
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem, PlanningResult
from pipetrain.planners.registry import run_planner
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile

MODELS = ("mmt", "dlrm", "candle-uno")
DEVICE_COUNTS = (4, 8, 16, 32)
SEARCH_COUNTS = (8,)
BRANCHES = (2, 4, 8, 16)
BRANCH_COUNT = {"mmt": 4, "dlrm": 14, "candle-uno": 7}  # the zoo defaults (dlrm: 7 dense + 7 sparse)
PER_NODE = 4
NVLINK = Link(5e-6, 150e9)
INFINIBAND = Link(5e-6, 100e9 / 8)  # EDR, 100 Gbit/s
PAPER_SIM = "GPP up to 1.61× over PipeDream/Piper, the gap growing with GPU count"
PAPER_SWEEP = "CANDLE-Uno: the gain grows with branches, up to 2× at 16"
PAPER_SEARCH = "GraphPipe's search 9–21× faster than the baselines', under a minute in all cases"
RESTRICTED = "pipedream-1f1b"
RESTRICTED_IS = ("the paper's PipeDream baseline as we model it: PipeDream's DP on the linearised model, 1F1B only "
                 "(the pipedream planner with Constraints(method=1f1b); unrestricted, it also tries GPipe)")
SIMULATOR = ("simulate", "build_schedule", "steady_timeline", "overflows")
"""The functions of :mod:`pipetrain.planners.score` whose time counts as simulation."""


@dataclass(frozen=True)
class SimRow:
    """One planner's answer on one model and cluster: ``stages`` as ``<layers>`` or
    ``<layers>×<replicas>``; ``depth`` the stages on the stage graph's longest path."""

    model: str
    branches: int
    sweep: bool
    n_devices: int
    batch: int
    planner: str
    method: str
    micro_batch: int
    n_micro: int
    stages: list[str]
    depth: int
    devices_used: int
    iteration_s: float
    samples_per_s: float
    search_s: float
    cpu_s: float
    simulate_cpu_s: float


def summit(n_devices: int) -> Cluster:
    """``n_devices`` V100s, 4 per node on NVLink, nodes on 100 Gbit/s InfiniBand (Summit-like)."""
    return Cluster.homogeneous("v100", max(1, n_devices // PER_NODE), min(PER_NODE, n_devices), NVLINK, INFINIBAND)


def depth(plan: Plan) -> int:
    """Stages on the longest path of the plan's stage graph (a chain: its stage count)."""
    n = len(plan.stages)
    edges = plan.edges or tuple((k, k + 1) for k in range(n - 1))
    longest = [1] * n
    for a, b in sorted(edges):  # edges go from lower to higher stages
        longest[b] = max(longest[b], longest[a] + 1)
    return max(longest)


def problem_of(graph_name: str, profile: Profile, n_devices: int, batch: int, **overrides: int) -> PlanningProblem:
    graph = build_model(graph_name, **overrides)
    return PlanningProblem(ModelRef.of(graph), CostModel(profile, summit(n_devices)), batch)


@contextmanager
def simulation_clock() -> Iterator[list[float]]:
    """Count the CPU seconds spent in the simulator's entry points (:data:`SIMULATOR`) while inside;
    the planners reach them through :mod:`pipetrain.planners.score` (recompute's memory check too)."""
    spent = [0.0]
    saved = {name: getattr(scoring, name) for name in SIMULATOR}

    def clocked(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - t0
        return run

    for name, fn in saved.items():
        setattr(scoring, name, clocked(fn))
    try:
        yield spent
    finally:
        for name, fn in saved.items():
            setattr(scoring, name, fn)


def timed(planner: str, problem: PlanningProblem) -> tuple[PlanningResult, float, float, float]:
    """The planner's result, its wall and CPU seconds, and the CPU seconds of them in the simulator.
    ``pipedream-1f1b`` is the :data:`RESTRICTED` baseline."""
    if planner == RESTRICTED:
        planner, problem = "pipedream", PlanningProblem(problem.model, problem.cost, problem.batch_size,
                                                        constraints=Constraints(method=Method.ONE_F_ONE_B))
    with simulation_clock() as spent:
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_planner(planner, problem)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return result, wall, cpu, spent[0]


def sim_row(model: str, branches: int, sweep: bool, problem: PlanningProblem, planner: str) -> SimRow:
    """Plan ``problem`` with ``planner`` and describe its fastest feasible plan."""
    if planner == "balanced":
        n = min(problem.cost.cluster.n_devices, len(problem.layer_names))
        problem = PlanningProblem(problem.model, problem.cost, problem.batch_size, constraints=Constraints(n_stages=n))
    result, seconds, cpu, simulating = timed(planner, problem)
    plan, best = result.plan, result.candidates[0]
    sizes = plan.stages[0].forward_sizes
    return SimRow(model, branches, sweep, problem.cost.cluster.n_devices, problem.batch_size, planner,
                  plan.method.value, max(sizes), len(sizes), [s.label for s in plan.stages], depth(plan), plan.n_ranks,
                  best.iteration_s, problem.batch_size / best.iteration_s, seconds, cpu, simulating)


def speedup(rows: list[SimRow], model: str, branches: int, n: int, against: str = "") -> float:
    """GPP samples/s over the best SPP's (pipedream or balanced; or only ``against``) for one setting."""
    mine = [r for r in rows if (r.model, r.branches, r.n_devices) == (model, branches, n)]
    gpp = next(r.samples_per_s for r in mine if r.planner == "graphpipe")
    return gpp / max(r.samples_per_s for r in mine if r.planner == against or
                     (not against and r.planner not in ("graphpipe", RESTRICTED)))


def sim_name(args: argparse.Namespace) -> str:
    """``sim``, or ``sim-<models>`` when ``--models`` picks some."""
    return "sim" if args.quick or tuple(args.models) == MODELS else "sim-" + "-".join(args.models)


def sim_part(args: argparse.Namespace) -> list[SimRow]:
    """Part 1: every model on every GPU count, then the CANDLE-Uno branch sweep."""
    models, counts = (("candle-uno",), (4, 8)) if args.quick else (tuple(args.models), tuple(args.gpus))
    settings = [(m, 0, n) for m in models for n in counts]
    if args.sweep_gpus and "candle-uno" in models:
        settings += [("candle-uno", b, args.sweep_gpus) for b in ((2, 4) if args.quick else BRANCHES)]
    rows: list[SimRow] = []
    profiles: dict[tuple[str, int], Profile] = {}
    for model, branches, n in settings:
        overrides = {"branches": branches} if branches else {}
        key = (model, branches)
        if key not in profiles:  # one profile per model, its grid up to the largest batch
            biggest = args.per_gpu * max(c for m, b, c in settings if (m, b) == key)
            profiles[key] = estimate_profile(build_model(model, **overrides), "v100", biggest, precision=args.precision)
        problem = problem_of(model, profiles[key], n, args.per_gpu * n, **overrides)
        planners = ["graphpipe", "pipedream", RESTRICTED]
        planners += ["balanced"] if n <= args.balanced_max and not branches else []
        for planner in planners:
            rows.append(sim_row(model, branches or BRANCH_COUNT[model], bool(branches), problem, planner))
            r = rows[-1]
            print(f"{model:10s} br={r.branches:2d} D={n:2d} B={r.batch:4d} {planner:14s} {r.samples_per_s:9.1f} "
                  f"samples/s  {r.search_s:6.2f} s (cpu {r.cpu_s:6.2f}, simulating {r.simulate_cpu_s:6.2f})  "
                  f"{' '.join(r.stages)}", flush=True)
        write_atomic(args.out / f"{sim_name(args)}.json", json.dumps([asdict(r) for r in rows], indent=1))
    return rows


def sim_report(rows: list[SimRow], args: argparse.Namespace, seconds: float) -> str:
    """Markdown: throughput table per model and GPU count, the branch sweep, and every plan."""
    picks = "" if args.quick else f" --models {' '.join(args.models)} --gpus {' '.join(map(str, args.gpus))}"
    lines = [
        "# GraphPipe (1): GPP vs SPP, simulated on Summit-like V100 clusters (estimated profiles)", "",
        f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --sim{' --quick' if args.quick else ''}"
        f"{picks} --per-gpu {args.per_gpu} --sweep-gpus {args.sweep_gpus} --balanced-max {args.balanced_max} "
        f"--precision {args.precision} "
        f"--out {args.out}`; took {seconds:.0f} s. "
        f"4 V100 per node on NVLink 150 GB/s, nodes on 100 Gbit/s InfiniBand; mini-batch {args.per_gpu} per GPU; "
        f"profiles estimated at {args.precision}. {RESTRICTED}: {RESTRICTED_IS}.", "",
        f"Paper: {PAPER_SIM}; {PAPER_SWEEP}.", "",
        "| model | branches | GPUs | batch | GPP samples/s | pipedream samples/s | pipedream-1f1b samples/s | "
        "balanced samples/s | GPP / best SPP | GPP / pipedream-1f1b | GPP depth | SPP depth |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r.sweep, r.model, r.branches, r.n_devices) for r in rows})
    for _, model, branches, n in keys:
        by = {r.planner: r for r in rows if (r.model, r.branches, r.n_devices) == (model, branches, n)}
        bal = f"{by['balanced'].samples_per_s:,.0f}" if "balanced" in by else "—"
        spp = max((r for p, r in by.items() if p not in ("graphpipe", RESTRICTED)), key=lambda r: r.samples_per_s)
        lines.append(f"| {model} | {branches} | {n} | {by['graphpipe'].batch} | {by['graphpipe'].samples_per_s:,.0f} | "
                     f"{by['pipedream'].samples_per_s:,.0f} | {by[RESTRICTED].samples_per_s:,.0f} | {bal} | "
                     f"{speedup(rows, model, branches, n):.2f}× | "
                     f"{speedup(rows, model, branches, n, RESTRICTED):.2f}× | "
                     f"{by['graphpipe'].depth} | {spp.depth} |")
    lines += ["", "## Plans (stages as layers[×replicas]; b = micro-batch size, m = micro-batches)", "",
              "Search: the planner call's wall seconds, its CPU seconds, and the CPU seconds of those in the "
              "simulator (schedule, events, memory check); planner = CPU − simulator.", "",
              "| model | branches | GPUs | planner | method | b | m | devices used | depth | stages | search s | "
              "cpu s | simulator cpu s | planner cpu s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.branches} | {r.n_devices} | {r.planner} | {r.method} | {r.micro_batch} | "
                     f"{r.n_micro} | {r.devices_used} | {r.depth} | {' '.join(r.stages)} | {r.search_s:.2f} | "
                     f"{r.cpu_s:.2f} | {r.simulate_cpu_s:.2f} | {r.cpu_s - r.simulate_cpu_s:.2f} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SearchRow:
    """Planner wall times (s) on one model and cluster, every repeat, and their medians."""

    model: str
    n_devices: int
    batch: int
    graphpipe_s: list[float]
    pipedream_s: list[float]

    @property
    def ratio(self) -> float:
        """PipeDream's median time over graphpipe's (> 1: graphpipe is faster)."""
        return statistics.median(self.pipedream_s) / statistics.median(self.graphpipe_s)


def search_part(args: argparse.Namespace) -> list[SearchRow]:
    """Part 2: both planners ``--repeats`` times on each problem, alternating, on this machine."""
    models, counts = (("candle-uno",), (4,)) if args.quick else (tuple(args.models), tuple(args.search_gpus))
    rows: list[SearchRow] = []
    for model in models:
        profile = estimate_profile(build_model(model), "v100", args.per_gpu * max(counts), precision=args.precision)
        for n in counts:
            problem = problem_of(model, profile, n, args.per_gpu * n)
            times: dict[str, list[float]] = {"graphpipe": [], "pipedream": []}
            for k in range(args.repeats):
                order = ("graphpipe", "pipedream") if k % 2 == 0 else ("pipedream", "graphpipe")
                for planner in order:
                    times[planner].append(timed(planner, problem)[2])
            rows.append(SearchRow(model, n, problem.batch_size, times["graphpipe"], times["pipedream"]))
            print(f"{model:10s} D={n:2d} graphpipe {statistics.median(times['graphpipe']):6.2f} s  pipedream "
                  f"{statistics.median(times['pipedream']):6.2f} s  ({rows[-1].ratio:.2f}×)", flush=True)
            write_atomic(args.out / "search.json",
                         json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=1))
    return rows


def search_report(rows: list[SearchRow], args: argparse.Namespace, seconds: float) -> str:
    """Markdown: median planner times and their ratio."""
    lines = [
        "# GraphPipe (2): search time, graphpipe planner vs PipeDream's DP planner", "",
        f"Command: `PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --search"
        f"{' --quick' if args.quick else ''} --search-gpus {' '.join(map(str, args.search_gpus))} "
        f"--repeats {args.repeats} --per-gpu {args.per_gpu} --out {args.out}`; "
        f"took {seconds:.0f} s on {platform.processor() or platform.machine()} (shared 2-core container, noisy), "
        f"torch {torch.__version__}. CPU seconds of the planner call (``time.process_time``: the machine's load "
        f"does not inflate them), median of {args.repeats} runs each, alternating.", "",
        f"Paper: {PAPER_SEARCH}.", "",
        "| model | GPUs | batch | graphpipe s | pipedream s | pipedream / graphpipe |", "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.model} | {r.n_devices} | {r.batch} | {statistics.median(r.graphpipe_s):.2f} | "
                     f"{statistics.median(r.pipedream_s):.2f} | {r.ratio:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/graphpipe"))
    parser.add_argument("--sim", action="store_true", help="part 1: simulated GPP vs SPP, and the branch sweep")
    parser.add_argument("--search", action="store_true", help="part 2: planner search times")
    parser.add_argument("--measured", action="store_true", help="part 3: measured on 2 and 3 local ranks")
    parser.add_argument("--quick", action="store_true", help="smoke run: small subsets of every part")
    parser.add_argument("--per-gpu", type=int, default=32, help="mini-batch samples per GPU (default 32)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="sim, search: the models")
    parser.add_argument("--gpus", type=int, nargs="+", default=list(DEVICE_COUNTS), help="sim: GPU counts")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp16",
                        help="estimated profiles' precision (default fp16: the V100's 80 TFLOP/s tensor cores)")
    parser.add_argument("--sweep-gpus", type=int, default=16, help="GPUs of the branch sweep (default 16; 0: none)")
    parser.add_argument("--balanced-max", type=int, default=8, help="plan with balanced up to this many GPUs")
    parser.add_argument("--search-gpus", type=int, nargs="+", default=list(SEARCH_COUNTS),
                        help="search: GPU counts (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="search: runs per planner (default 3)")
    parser.add_argument("--steps", type=int, default=30, help="measured: steps per run, 2 of them warm-up")
    parser.add_argument("--rounds", type=int, default=6, help="measured: rounds of alternating runs (default 6)")
    args = parser.parse_args(argv)
    if not (args.sim or args.search or args.measured):
        parser.error("choose at least one of --sim, --search, --measured")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sim:
        start = time.perf_counter()
        sim_rows = sim_part(args)
        write_atomic(args.out / f"{sim_name(args)}.md", sim_report(sim_rows, args, time.perf_counter() - start))
    if args.search:
        start = time.perf_counter()
        search_rows = search_part(args)
        write_atomic(args.out / "search.md", search_report(search_rows, args, time.perf_counter() - start))
    if args.measured:
        measured_part(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
