"""Calibration on the model's own work: the terms a per-layer profile and a probe cannot see.

    calibration = calibrate_cluster(graph, profile, cluster, batch)   # 3 settings, 3 runs of >= 1 s each
    cluster = calibration.apply(cluster)                # Device.speed, action_overhead_s, collective

The profiler times each layer alone, many times over, with its weights and activations warm in the
caches; the runtime runs a stage's layers one after the other, switches between micro-batches, model
chunks and actions, and waits on messages. Three things then differ from the profile and the probe,
and they depend on the model (a layer's size decides how much falls out of the caches between actions):

- ``speed``: the layers' compute composed in a pipeline against their profiled sum (``Device.speed``;
  fitted on a 2-core container: gpt-tiny 0.88-0.97, the 8-layer mlp 0.97-1.01);
- ``overhead_s``: the runtime's seconds per F, B or W action on this model (``Cluster.action_overhead_s``;
  there gpt-tiny 0.2-0.3 ms, the mlp, whose layers hold 32 MiB of weights each, 0.9-1.9 ms;
  the probe of :mod:`~pipetrain.calibrate.overhead` measures it on a tiny model, where actions
  cost microseconds and nothing falls out of a cache);
- ``collective``: the all-reduce of a replicated stage's gradients at the end of a step
  (``Cluster.collective``). The probe times it back to back, with both ranks' threads awake; in a
  step it follows a backward, the ranks arrive apart and gloo's event loop has to wake up (on
  gpt-tiny's data-parallel plan it took ~3 ms where the probe's fit gave 1.1 ms).

The first two are fitted to two short runs of the model itself on the cluster's ranks: ``1f1b`` on one
micro-batch (few actions: the time is mostly compute) and ``zbv`` on ``min(8, batch)`` (six actions per
micro-batch and rank: the time grows with the overhead), each the median of ``runs`` runs of at
least ``steps`` timed steps and :data:`RUN_S` seconds. The simulated iteration ``T(a, o)`` is close
to linear in ``a = 1/speed`` and ``o``, so three Newton steps on the 2×2 system
``T_i(a, o) = measured_i`` solve it (:func:`fit_terms`, pure).
Re-predicting the 21 two-rank settings of a Core benchmark run from its own profile with the terms
fitted to two of its settings this way: median |error| 3.4 % (mlp) and 2.2 % (gpt-tiny), worst 6.2 %
and 12.6 %, against 7.0 % / 18.6 % median with the tiny model's overhead alone (benchmarks/history/core.md).
Then, with those two terms, a third run of the model data-parallel (every layer on every rank, one
micro-batch each) fits the all-reduce: its fixed cost where the model's gradients are small, its
seconds per byte where they are large (whichever dominates that all-reduce; the iteration is linear in
either, so one run gives it, :func:`fit_collective`). In a Core benchmark run calibrated on the first
two terms every setting's prediction was within 15.0 % of its measured median, in one calibrated on
all three within 7.6 % (benchmarks/history/core.md).

Every run trains with the optimizer the user will train with (``optimizer``; ``pipetrain probe
--calibrate --optimizer``), and every simulation prices that optimizer's STEP
(:class:`~pipetrain.cost.CostModel`'s ``optimizer``), so the fitted terms hold for its steps, which
for Adam(W) cost several times SGD's; :attr:`Calibration.optimizer` records which it was.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, TrainJob, train_many
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

__all__ = ["Calibration", "calibrate_cluster", "calibration_plans", "fit_collective", "fit_terms",
           "replicated_plan", "with_terms"]

_MIN_SPEED, _MAX_SPEED = 0.2, 5.0
_DA, _DO = 0.05, 1e-4  # finite-difference steps of 1/speed and of the overhead (s)


@dataclass(frozen=True)
class Calibration:
    """The fitted terms and the runs they were fitted to.

    Attributes:
        speed: the model's compute in the runtime relative to its profile (each device's ``speed``).
        overhead_s: the runtime's seconds per F, B or W action on this model.
        settings: the calibration runs, as ``"method m=n"`` (``"replicated ×r"`` for the data-parallel one).
        measured_s: per setting, the median measured iteration.
        predicted_s: per setting, the simulated iteration with the fitted terms.
        collective: the fitted all-reduce (None: not calibrated, the cluster's is kept).
        optimizer: the optimizer the runs trained with and the simulations priced.
    """

    speed: float
    overhead_s: float
    settings: tuple[str, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    collective: Link | None = None
    optimizer: OptimizerName = "sgd"

    def apply(self, cluster: Cluster) -> Cluster:
        """``cluster`` with every device's speed scaled by :attr:`speed`, the fitted overhead, and the
        fitted all-reduce where there is one."""
        fitted = with_terms(cluster, self.speed, self.overhead_s)
        return fitted if self.collective is None else replace(fitted, collective=self.collective)

    def describe(self) -> str:
        runs = ", ".join(f"{s} {m * 1e3:.1f} ms (fit {p * 1e3:.1f})"
                         for s, m, p in zip(self.settings, self.measured_s, self.predicted_s, strict=True))
        link = self.collective
        allreduce = "" if link is None else (f", all-reduce {link.latency_s * 1e6:.0f} µs + bytes at "
                                             f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
        return (f"compute at {self.speed:.3f}× the profile, {self.overhead_s * 1e6:.0f} µs per action{allreduce}; "
                f"from {runs}, training with {self.optimizer}")


def with_terms(cluster: Cluster, speed: float, overhead_s: float) -> Cluster:
    """``cluster`` with each device's speed multiplied by ``speed`` and ``overhead_s`` per action."""
    devices = tuple(replace(d, speed=d.speed * speed) for d in cluster.devices)
    return replace(cluster, devices=devices, action_overhead_s=overhead_s)


def calibration_plans(graph: LayerGraph, profile: Profile, cluster: Cluster, batch: int,
                      optimizer: OptimizerName = "sgd") -> tuple[Plan, Plan]:
    """The two calibration plans on the cluster's ranks, stepping ``optimizer``: balanced ``1f1b`` on one
    micro-batch, and ``zbv`` on ``min(8, batch)`` (``zb1`` where the model has fewer layers than two per
    rank; half as many, at most, for a BatchNorm that trains on 2 samples or more)."""
    n = cluster.n_devices
    if n < 2 or len(graph) < n:
        raise UserError(f"calibration runs a pipeline of one stage per rank: {graph.name!r} has {len(graph)} "
                        f"layers for {n} ranks; calibrate on 2 or more ranks and no more ranks than layers")
    model, cost = ModelRef.of(graph), CostModel(profile, cluster, optimizer=optimizer)
    m = max(1, min(8, batch // model.smallest_microbatch))  # micro-batches a BatchNorm trains on
    few = build_balanced_plan(model, cost, method=Method.ONE_F_ONE_B, n_stages=n, batch_size=batch, n_micro=1)
    if len(graph) >= 2 * n:
        many = build_interleaved_plan(model, cost, n_ranks=n, chunks=2, batch_size=batch, n_micro=m,
                                      method=Method.ZBV)
    else:
        many = build_balanced_plan(model, cost, method=Method.ZB1, n_stages=n, batch_size=batch, n_micro=m)
    return replace(few, optimizer=optimizer), replace(many, optimizer=optimizer)


def replicated_plan(graph: LayerGraph, cluster: Cluster, batch: int, optimizer: OptimizerName = "sgd") -> Plan:
    """Data parallelism on the cluster's ranks: one stage of every layer, replicated on each rank, one
    micro-batch per replica, its gradients all-reduced at the step of ``optimizer``."""
    model, n = ModelRef.of(graph), cluster.n_devices
    least = n * model.smallest_microbatch  # a micro-batch of 2 or more per rank through a BatchNorm on [b, C]
    if batch < least:
        raise UserError(f"a data-parallel calibration gives each of {n} ranks a micro-batch: batch {batch} is "
                        f"too small; calibrate with --batch {least} or more")
    sizes = equal_sizes(batch, n)
    return Plan(model.name, model.fingerprint, batch, Method.GPIPE,
                (StagePlan(tuple(model.layer_names), tuple(range(n)), sizes, sizes),), optimizer=optimizer)


def fit_collective(plan: Plan, profile: Profile, cluster: Cluster, measured_s: float) -> Link:
    """The all-reduce that makes the simulated iteration of ``plan`` (replicated) on ``cluster`` equal
    ``measured_s``: the cluster's collective (its intra-node link where it has none) with the term that
    dominates the plan's all-reduce moved along the iteration's slope in it — the latency for small
    gradients (gpt-tiny's 0.9 MB), the seconds per byte for large ones (the mlp's 268 MB) — never below 0."""
    base = cluster.collective or cluster.intra_node
    stage = next(s for s in plan.stages if len(s.ranks) > 1)
    r, n_bytes = len(stage.ranks), _cost(plan, profile, cluster).parameter_bytes(stage.layers)
    by_latency = 2 * (r - 1) * base.latency_s >= 2 * (r - 1) / r * n_bytes / base.bandwidth_bytes_per_s
    start = base.latency_s if by_latency else 1.0 / base.bandwidth_bytes_per_s
    step = _DO if by_latency else start * 0.1

    def link(x: float) -> Link:
        return Link(x, base.bandwidth_bytes_per_s) if by_latency else Link(base.latency_s, 1.0 / max(x, 1e-15))

    def simulated(x: float) -> float:
        c = replace(cluster, collective=link(x))
        return simulate(build_schedule(plan), plan, _cost(plan, profile, c)).iteration_s

    t0 = simulated(start)
    slope = (simulated(start + step) - t0) / step
    if slope <= 0:
        raise ValueError("the plan's iteration does not depend on the all-reduce: give a replicated plan")
    return link(max(0.0 if by_latency else 1e-15, start + (measured_s - t0) / slope))


def _cost(plan: Plan, profile: Profile, cluster: Cluster) -> CostModel:
    """The cost model pricing ``plan``: its optimizer's STEP."""
    return CostModel(profile, cluster, optimizer=plan.optimizer, clip_grad_norm=plan.clip_grad_norm)


def _simulated(plans: Sequence[Plan], profile: Profile, cluster: Cluster, a: float, o: float) -> np.ndarray:
    c = with_terms(cluster, 1.0 / a, o)
    return np.array([simulate(build_schedule(p), p, _cost(p, profile, c)).iteration_s for p in plans])


def fit_terms(plans: Sequence[Plan], profile: Profile, cluster: Cluster, measured_s: Sequence[float],
              iterations: int = 3) -> tuple[float, float]:
    """``(speed, overhead_s)`` whose simulated iterations of the two ``plans`` on ``cluster`` (its
    devices' speeds scaled by ``speed``) equal ``measured_s``: Newton steps on ``(1/speed, overhead)``
    with finite-difference slopes, kept within ``speed`` 0.2-5 and ``overhead_s ≥ 0``; where the
    overhead stops at 0, the speed alone fitted to both runs (:func:`_speed_alone`)."""
    if len(plans) != 2 or len(measured_s) != 2:
        raise ValueError("fit_terms fits two terms to two plans and their two measured iterations")
    target = np.asarray(measured_s, dtype=float)
    a, o = 1.0, cluster.action_overhead_s
    for _ in range(iterations):
        base = _simulated(plans, profile, cluster, a, o)
        slopes = np.column_stack([(_simulated(plans, profile, cluster, a + _DA, o) - base) / _DA,
                                  (_simulated(plans, profile, cluster, a, o + _DO) - base) / _DO])
        try:
            da, do = np.linalg.solve(slopes, target - base)
        except np.linalg.LinAlgError:  # the two runs do not tell the terms apart: fit the speed alone
            da, do = float((target - base).sum() / slopes[:, 0].sum()), 0.0
        a = min(1 / _MIN_SPEED, max(1 / _MAX_SPEED, a + da))
        o = max(0.0, o + do)
    if o == 0.0:  # the runs ask for a negative overhead: none, and the speed that fits both best
        a = _speed_alone(plans, profile, cluster, target, a, iterations)
    return 1.0 / a, o


def _speed_alone(plans: Sequence[Plan], profile: Profile, cluster: Cluster, target: np.ndarray, a: float,
                 iterations: int) -> float:
    """``1/speed`` without overhead that minimises the runs' squared relative errors (Gauss-Newton
    steps from ``a``): the two-term solve with its overhead clamped to 0 fits one run and misses the
    other (a transformer's zbv run: fitted 85.8 ms against 64.3 measured, its 1f1b run 38.7 against 37.0)."""
    for _ in range(iterations):
        base = _simulated(plans, profile, cluster, a, 0.0)
        slope = (_simulated(plans, profile, cluster, a + _DA, 0.0) - base) / _DA / target
        a = min(1 / _MIN_SPEED, max(1 / _MAX_SPEED, a + float(slope @ ((target - base) / target) / (slope @ slope))))
    return a


def _label(plan: Plan) -> str:
    if plan.replicated:
        return f"replicated ×{len(plan.stages[0].ranks)}"
    return f"{plan.method.value} m={len(plan.stages[0].forward_sizes)}"


RUN_S = 1.0
"""Seconds each calibration run lasts at least (as the profile and probe predict it): a run of a few
milliseconds per step over 10 steps measures the machine's scheduling more than the model (mlp-digits'
1f1b runs took 3.4-10.8 ms per step from one run to the next)."""


def run_steps(plan: Plan, profile: Profile, cluster: Cluster, at_least: int, run_s: float = RUN_S) -> int:
    """Timed steps for a calibration run of ``plan`` to last ``run_s`` as predicted, at least
    ``at_least`` and at most 500."""
    predicted = float(_simulated([plan], profile, cluster, 1.0, cluster.action_overhead_s)[0])
    return max(at_least, min(500, math.ceil(run_s / max(predicted, 1e-6))))


def calibrate_cluster(graph: LayerGraph, profile: Profile, cluster: Cluster, batch: int, *, steps: int = 10,
                      runs: int = 3, replicated: bool = True, optimizer: OptimizerName = "sgd",
                      run_s: float = RUN_S) -> Calibration:
    """Run the two :func:`calibration_plans` ``runs`` times each (2 warm-up steps, then at least ``steps``
    timed ones and enough for ``run_s`` seconds, one thread per rank, training with ``optimizer``)
    and fit ``speed`` and ``overhead_s`` to their median iterations; then, unless not ``replicated``,
    :func:`replicated_plan`'s runs fit the all-reduce (module docstring).

    Every run is made in one launch of the ranks (:func:`~pipetrain.runtime.train.train_many`: they
    start once, not once per run), the settings taking turns (``a, b, c, a, b, c``) so that a change
    in the machine's load weighs on each alike.
    """
    plans = list(calibration_plans(graph, profile, cluster, batch, optimizer))
    if replicated:
        plans.append(replicated_plan(graph, cluster, batch, optimizer))
    configs = [TrainConfig(steps=run_steps(plan, profile, cluster, steps, run_s), warmup_steps=2, progress=False,
                           threads_per_rank=1, optimizer=optimizer) for plan in plans]
    jobs = [TrainJob(graph, plan, config) for _ in range(max(1, runs)) for plan, config in zip(plans, configs,
                                                                                                  strict=True)]
    iterations = [batch / result.samples_per_s for result in train_many(jobs)]
    measured = [statistics.median(iterations[k::len(plans)]) for k in range(len(plans))]
    speed, overhead = fit_terms(plans[:2], profile, cluster, measured[:2])
    fitted = [float(x) for x in _simulated(plans[:2], profile, cluster, 1.0 / speed, overhead)]
    collective = None
    if replicated:
        terms = with_terms(cluster, speed, overhead)
        collective = fit_collective(plans[-1], profile, terms, measured[-1])
        with_collective = replace(terms, collective=collective)
        fitted += [float(x) for x in _simulated(plans[-1:], profile, with_collective, 1.0, overhead)]
    return Calibration(speed, overhead, tuple(_label(p) for p in plans), tuple(measured), tuple(fitted), collective,
                       optimizer)
