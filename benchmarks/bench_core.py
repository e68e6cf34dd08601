"""Core benchmark (a) + (b): pipetrain against torch pipelining and single-process training.

    .venv/bin/python benchmarks/bench_core.py --repeats 5 --out benchmarks/results/core
    .venv/bin/python benchmarks/bench_core.py --quick --out /tmp/core-quick      # smoke run

(a) Throughput on 2 local ranks (gloo, one thread each) for each model: single-process training
(one thread), every torch.distributed.pipelining schedule at the 1, 2, 4, 8 micro-batches torch allows
(``torch_schedules``), pipetrain gpipe/1f1b/zb1 at the same m (its balanced two-stage partition, checked to
equal torch's GPipe/1F1B split) and interleaved and zbv (2 chunks per rank, looping or in a V), and
pipetrain at the setting its ``auto`` planner picks (every planner tried, the fastest prediction kept),
from a cluster probed with each model's own work (contention) and the runtime's measured cost per
action. (b) Fidelity: the simulator's predicted iteration time against the measured one for every
pipetrain run.

Every configuration of every model runs once per round, the rounds repeat ``--repeats`` times (the
starting configuration rotates each round), and each configuration's result is the median over
rounds of its per-run samples/s (each run: the batch over its median timed step, after 2 warm-up
steps). A configuration that hangs (times out) is reported and not retried; one that fails is
retried every round.

Single-process training runs twice, each in a fresh process: plain PyTorch (``single``), and
with pipetrain's allocator setting (``single+alloc``, :mod:`pipetrain.allocator`), since that
setting alone makes CPU training faster. ``planned-noalloc`` is the planned setting without it,
so the two effects can be told apart.

Output under ``--out``: ``core.json`` (every run, rewritten after each), ``core.md`` (tables),
``gantt_<model>.png`` (predicted beside measured for the planned setting, the median run),
``cluster.json`` (the generic probe), ``cluster_<model>.json`` and ``profile_<model>.json`` (what
each model's predictions were made from).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Literal, TypeVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from common.torch_baseline import Schedule, run_torch_pipelining, stage_layers
from common.torch_schedules import SCHEDULES as TORCH_SCHEDULES
from core_report import describe, save_gantts, write_report
from harness import bounded

import pipetrain
from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.table import Profile
from pipetrain.runtime.job.config import TrainConfig as TrainConfigT
from pipetrain.runtime.job.config import TrainResult as TrainResultT
from pipetrain.simulate.timeline import Timeline

Kind = Literal["single", "single+alloc", "torch", "pipetrain", "planned", "planned-noalloc"]
T = TypeVar("T")

SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "zb1", "interleaved", "zbv")
METHOD_OF: dict[str, Method] = {"gpipe": Method.GPIPE, "1f1b": Method.ONE_F_ONE_B, "zb1": Method.ZB1,
                                "interleaved": Method.INTERLEAVED, "zbv": Method.ZBV}
LOOPED = ("interleaved", "zbv")  # two chunks per rank: looping or in a V
CHUNKS = 2  # model chunks per rank of pipetrain's interleaved settings (torch's interleaved ones: see torch_schedules)


# ---- what runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One configuration of one model."""

    kind: Kind
    schedule: str = ""
    n_micro: int = 0

    @property
    def label(self) -> str:
        plain = self.kind in ("single", "single+alloc", "planned", "planned-noalloc")
        return self.kind if plain else f"{self.kind} {self.schedule} m={self.n_micro}"


@dataclass
class Run:
    """One measurement of one configuration."""

    model: str
    label: str
    round: int
    status: str
    samples_per_s: float | None = None
    iteration_s: float | None = None
    predicted_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class ModelSetup:
    """Everything decided before the timed rounds for one model."""

    name: str
    graph: LayerGraph
    batch: int
    steps: int
    profile: Profile
    cluster: Cluster
    plans: dict[str, Plan]
    predicted: dict[str, Timeline]
    predicted_alone_s: dict[str, float]
    planned_candidates: list[tuple[str, int, float]]
    partition_note: str
    calibration: str = ""


def configs(micro: Sequence[int]) -> list[Config]:
    """Single process, torch × schedule × m (those torch allows), pipetrain × schedule × m, planned."""
    out = [Config("single"), Config("single+alloc")]
    out += [Config("torch", s, m) for s in TORCH_SCHEDULES for m in micro if TORCH_SCHEDULES[s].allows(m, 2)]
    out += [Config("pipetrain", s, m) for s in SCHEDULES for m in micro]
    out += [Config("planned"), Config("planned-noalloc")]
    return out


# ---- setup ------------------------------------------------------------------------------------


def setup_model(name: str, batch: int, steps: int, cluster: Cluster, micro: Sequence[int],
                calibrate: bool = True) -> ModelSetup:
    """Profile the model, calibrate the cluster on its own work (unless not ``calibrate``), build every
    pipetrain plan (same settings and planned), predict each."""
    graph = build_model(name)
    profile = profile_logged(graph, batch)
    calibration = ""
    if calibrate:
        from pipetrain.calibrate.fit import calibrate_cluster

        fitted = calibrate_cluster(graph, profile, cluster, batch, runs=3)
        cluster, calibration = fitted.apply(cluster), fitted.describe()
        print(f"[{name}] calibrated: {calibration}", flush=True)
    cost = CostModel(profile, cluster)
    plans = setting_plans(graph, cost, batch, micro)
    auto = api.plan(graph, profile, cluster, batch_size=batch, planner="auto")  # every planner, the fastest kept
    planned, candidates = auto.plan, list(auto.candidates)
    plans["planned"] = planned
    predicted = {label: api.predict(plan, profile, cluster)[1] for label, plan in plans.items()}
    predicted["single"] = _predict_single(graph, profile, batch, cluster)
    predicted["single+alloc"] = predicted["single"]
    predicted["planned-noalloc"] = predicted["planned"]
    # the same plans on ranks that never slow each other (Device.speed 1): brackets the contention model
    alone = replace(cluster, shared_speed=())
    predicted_alone = {label: api.predict(plan, profile, alone)[1].iteration_s for label, plan in plans.items()}
    note = _partition_note(graph, plans)
    top = [(c.plan.method.value, len(c.plan.stages[0].forward_sizes), c.iteration_s) for c in candidates[:8]]
    print(f"[{name}] planned: {describe(planned)}, predicted {predicted['planned'].iteration_s * 1e3:.1f} ms; "
          f"{note}", flush=True)
    return ModelSetup(name, graph, batch, steps, profile, cluster, plans, predicted, predicted_alone, top, note,
                      calibration)


def setting_plans(graph: LayerGraph, cost: CostModel, batch: int, micro: Sequence[int]) -> dict[str, Plan]:
    """Every pipetrain setting's plan on 2 ranks, by label: balanced stages, or ``CHUNKS`` per rank for
    the looped schedules."""
    plans: dict[str, Plan] = {}
    for schedule in SCHEDULES:
        for m in micro:
            plans[Config("pipetrain", schedule, m).label] = (
                build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=2, chunks=CHUNKS, batch_size=batch, n_micro=m,
                                       method=METHOD_OF[schedule])
                if schedule in LOOPED else
                build_balanced_plan(ModelRef.of(graph), cost, method=METHOD_OF[schedule], n_stages=2, batch_size=batch,
                                    n_micro=m))
    return plans


def _predict_single(graph: LayerGraph, profile: Profile, batch: int, cluster: Cluster) -> Timeline:
    """The simulator's time for one rank of ``cluster`` running the whole model on the whole batch, alone."""
    alone = replace(cluster.with_ranks(1), shared_speed=())
    plan = build_balanced_plan(ModelRef.of(graph), CostModel(profile, alone), method=Method.GPIPE, n_stages=1,
                               batch_size=batch, n_micro=1)
    return api.predict(plan, profile, alone)[1]


def _partition_note(graph: LayerGraph, plans: dict[str, Plan]) -> str:
    """Whether pipetrain's balanced partitions equal torch's equal-layer split."""
    equal = tuple(tuple(graph.names[i] for i in stage_layers(len(graph), k)) for k in range(2))
    differ = sorted(label for label, plan in plans.items() if tuple(s.layers for s in plan.stages) != equal)
    if not differ:
        return "every pipetrain partition equals torch's equal-layer split"
    return f"partitions differing from the equal-layer split: {', '.join(differ)}"


# ---- one run ----------------------------------------------------------------------------------


def run_config(setup: ModelSetup, config: Config, round_: int, timeout_s: float) -> tuple[Run, Timeline | None]:
    """Run one configuration once; returns the run and, for pipetrain, its measured timeline."""
    from pipetrain.runtime import TrainConfig, train

    run = Run(setup.name, config.label, round_, "ok")
    start = time.perf_counter()
    timeline: Timeline | None = None
    if config.kind == "torch":
        result = run_torch_pipelining(setup.name, setup.batch, config.n_micro, config.schedule,
                                      setup.steps, timeout_s)
        run.status, run.samples_per_s, run.iteration_s = result.status, result.samples_per_s, result.iteration_s
        run.step_times_s = list(result.step_times_s)
    else:
        train_config = TrainConfig(steps=setup.steps, warmup_steps=WARMUP_STEPS, progress=False,
                                   threads_per_rank=1, timeout_s=min(60.0, timeout_s))
        if config.kind in ("single", "single+alloc"):
            keep = config.kind == "single+alloc"
            out, run.status = bounded(lambda: _fresh_reference(setup, replace(train_config, keep_freed_memory=keep)),
                                       timeout_s)
        else:
            plan = setup.plans["planned" if config.kind == "planned-noalloc" else config.label]
            keep = config.kind != "planned-noalloc"
            out, run.status = bounded(lambda: train(setup.graph, plan, replace(train_config, keep_freed_memory=keep)),
                                       timeout_s)
        if out is not None:
            run.samples_per_s, run.iteration_s = out.samples_per_s, out.timeline.iteration_s
            run.step_times_s = list(out.step_times_s)
            timeline = out.timeline
        run.predicted_s = setup.predicted[config.label].iteration_s
    run.wall_s = time.perf_counter() - start
    return run, timeline


def _reference_child(model: str, batch: int, config: TrainConfigT, queue: mp.Queue[object]) -> None:
    from pipetrain.runtime import reference_train

    queue.put(reference_train(build_model(model), batch, config, return_state_dict=False))


def _fresh_reference(setup: ModelSetup, config: TrainConfigT) -> TrainResultT:
    """Single-process training in a fresh process: the allocator setting is per process and
    permanent, so the plain baseline must not run where it was applied (profiling applies it)."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue[object] = ctx.Queue()
    child = ctx.Process(target=_reference_child, args=(setup.name, setup.batch, config, queue))
    child.start()
    try:
        result = queue.get()
    finally:
        child.join()
    assert isinstance(result, TrainResultT)
    return result


# ---- the rounds -------------------------------------------------------------------------------


@dataclass
class Bench:
    """The state of a benchmark session."""

    setups: list[ModelSetup]
    configs: list[Config]
    repeats: int
    timeout_s: float
    out: Path
    meta: dict[str, object]
    runs: list[Run] = field(default_factory=list)
    planned_timelines: dict[str, list[tuple[float, Timeline]]] = field(default_factory=dict)
    failed: set[tuple[str, str]] = field(default_factory=set)

    def run_all(self) -> None:
        jobs = [(s, c) for s in self.setups for c in self.configs]
        total = self.repeats * len(jobs)
        done = 0
        for r in range(self.repeats):
            shift = (r * len(jobs)) // self.repeats  # rotate the starting configuration each round
            for setup, config in jobs[shift:] + jobs[:shift]:
                done += 1
                if (setup.name, config.label) in self.failed:
                    continue
                run, timeline = run_config(setup, config, r, self.timeout_s)
                self._record(setup, config, run, timeline)
                print(f"[{done}/{total}] round {r + 1} {_line(run)}", flush=True)
                self.save()

    def _record(self, setup: ModelSetup, config: Config, run: Run, timeline: Timeline | None) -> None:
        self.runs.append(run)
        if run.status.startswith("timeout"):  # errors are cheap and may be transient: retried each round
            self.failed.add((setup.name, config.label))
        if config.kind == "planned" and timeline is not None and run.samples_per_s:
            self.planned_timelines.setdefault(setup.name, []).append((run.samples_per_s, timeline))

    def save(self) -> None:
        data = {"meta": self.meta, "models": [_setup_json(s) for s in self.setups],
                "runs": [asdict(r) for r in self.runs]}
        write_atomic(self.out / "core.json", json.dumps(data, indent=1))


def _line(run: Run) -> str:
    sps = f"{run.samples_per_s:8.1f} samples/s" if run.samples_per_s else " " * 18
    it = f" {run.iteration_s * 1e3:7.1f} ms" if run.iteration_s else ""
    pred = f" (pred {run.predicted_s * 1e3:7.1f} ms)" if run.predicted_s and run.iteration_s else ""
    status = "" if run.status == "ok" else f"  [{run.status}]"
    return f"{run.model:9s} {run.label:22s} {sps}{it}{pred}  {run.wall_s:5.1f} s{status}"


def _setup_json(s: ModelSetup) -> dict[str, object]:
    return {
        "model": s.name, "batch": s.batch, "steps": s.steps, "warmup_steps": WARMUP_STEPS,
        "planned": describe(s.plans["planned"]), "planned_plan": json.loads(s.plans["planned"].to_json()),
        "planned_top_candidates": s.planned_candidates, "partition": s.partition_note,
        "profile_source": s.profile.source,
        "predicted_s": {label: t.iteration_s for label, t in s.predicted.items()},
        "predicted_speed1_s": s.predicted_alone_s, "calibration": s.calibration,
    }


# ---- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=5, help="rounds over all configurations (default 5)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/core"))
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, m in {1, 4}, 3-4 steps")
    p.add_argument("--models", nargs="+", default=["mlp", "gpt-tiny"])
    p.add_argument("--mlp-batch", type=int, default=128)
    p.add_argument("--gpt-batch", type=int, default=64)
    p.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--timeout", type=float, default=150.0, help="wall-clock bound per run (s)")
    p.add_argument("--overhead", type=float, default=None,
                   help=f"cluster action_overhead_s (default: measured by the probe; {CPU_ACTION_OVERHEAD_S} before)")
    p.add_argument("--probes", type=int, default=5, help="link/contention probes, median kept (default 5)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="price with the probe's terms only (default: calibrate speed and overhead on each model)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.micro = 1, [1, 4]
    return args


def steps_for(model: str, quick: bool) -> int:
    """Steps per run, warm-up included: enough timed steps for a stable median, bounded wall time."""
    if quick:
        return WARMUP_STEPS + (1 if model == "mlp" else 2)
    return WARMUP_STEPS + (5 if model == "mlp" else 20)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _git_head() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                             cwd=Path(__file__).resolve().parents[1], timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # a backgrounded run ignores SIGINT and dies on SIGTERM without cleanup: make both stop the
    # session through the finally blocks that reap the rank processes
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = {"mlp": args.mlp_batch, "gpt-tiny": args.gpt_batch}
    t0 = time.perf_counter()
    cluster, probe = probe_cluster(args.overhead, args.probes)
    print(f"probe: {probe}", flush=True)
    clusters, contention = {}, {}
    for m in args.models:  # the contention of each model's own work (two halves at a quarter of its batch)
        clusters[m], info = probe_cluster(cluster.action_overhead_s, args.probes,
                                          (build_model(m), max(1, batches.get(m, 64) // 4)), cluster)
        contention[m] = info["shared_speed"]
        print(f"[{m}] contention probe: {info}", flush=True)
    probe["model_shared_speed"] = contention
    setups = [setup_model(m, batches.get(m, 64), steps_for(m, args.quick), clusters[m], args.micro, args.calibrate)
              for m in args.models]
    meta: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version(),
                               "cpu_count": torch.multiprocessing.cpu_count(), "repeats": args.repeats,
                               "quick": args.quick, "micro": args.micro, "probe": probe, "warmup_steps": WARMUP_STEPS,
                               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "git_head": _git_head(),
                               "pipetrain": f"working-tree snapshot at start, imported from {pipetrain.__file__}"}
    write_atomic(args.out / "cluster.json", cluster.to_json())
    for setup in setups:  # calibrated on each model's own work
        write_atomic(args.out / f"cluster_{setup.name}.json", setup.cluster.to_json())
    for setup in setups:  # enough to re-predict any configuration later (e.g. at another speed)
        write_atomic(args.out / f"profile_{setup.name}.json", setup.profile.to_json())
    bench = Bench(setups, configs(args.micro), args.repeats, args.timeout, args.out, meta)
    bench.run_all()
    meta["wall_s"] = time.perf_counter() - t0
    bench.save()
    save_gantts(bench)
    print(write_report(bench))


if __name__ == "__main__":
    main()
