"""BaPipe: explore method × stage count × micro-batches × device order × balanced partition.

PAPERS.md §4 (BaPipe, Zhao et al. 2020, arXiv 2012.12544; §4.2–4.4 are pipetrain's reconstruction)::

    cost = CostModel({"h100": estimate_profile(graph, "h100", 64),
                      "v100": estimate_profile(graph, "v100", 64)}, cluster)
    result = explore(model=graph.name, fingerprint=graph.fingerprint(), layer_names=graph.names,
                     cost=cost, batch_size=64)
    print(bapipe_table(result))          # pipetrain.viz.plan_tables

For every method (``gpipe``, ``1f1b``), stage count ``S`` in ``1..min(devices, layers)``, micro-batch
count ``m`` and device order, the heterogeneity-aware DP of §4.4
(:func:`~pipetrain.plan.partition.hetero.hetero_partition`) cuts the layers so that the bottleneck
``max_k (F_k + B_k + C_k)`` is smallest and every stage fits its device: GPipe keeps all ``B``
samples' activations, 1F1B the first ``min(m, S - k)`` micro-batches on stage ``k`` (0-based);
parameters and optimizer state count :data:`~pipetrain.plan.microbatch.caps.SGD_STATE_COPIES` times.
Each cut is scored with the analytic iteration time of §4.2, ``T_iter = (m + S - 1) · max_k (F_k +
B_k + C_k)``, with ``F_k``, ``B_k`` including the runtime's per-action overhead and ``C_k`` the
activation into stage ``k`` and its gradient back (``comm="serial"``). pipetrain's simulator and
runtime send on a link of their own while the stage computes, so a slow link is rather a pipeline
resource beside the stages: ``comm="overlap"`` cuts and scores with ``max(F_k + B_k, C_k)``, ``C_k``
one direction. Neither model ranks plans as the simulator does (``benchmarks/bench_hetero.py``
ablates them: each finds the faster plan for some model), so by default (``comm="both"``) each
model proposes its own partitions. Per (method, ``S``, comm model) the ``simulate_top`` best are
simulated by the event simulator, the truth, and checked with
:func:`~pipetrain.plan.microbatch.caps.memory_need` against
:func:`~pipetrain.plan.microbatch.caps.device_memory`; a shortlisted plan that does not fit is kept
in the report, marked, and the next one is tried. With ``uedp`` asked for, UMPIPE's ``tidgap``
planner (small GA) runs on the stages of the best few feasible plans and its plan is kept when
faster. The fastest feasible simulated plan wins (ties: less memory, fewer micro-batches).

**Device orders.** Devices are grouped into types (same kind, memory and speed). For ``S`` devices
the explorer takes the sub-multisets of types of size ``S`` (fastest types first) and, for each,
every distinct order of its types, up to ``max_orders`` orders per ``S``; a multiset whose orders no
longer fit the budget gets only its speed-sorted order (fastest first). A homogeneous cluster has one
order. Within a type, each stage takes the free device on the previous stage's node if there is one
(fewer slow cross-node links), else the lowest-numbered.

**Ranks.** A plan's ranks index :attr:`BapipeResult.cluster`. With every device used it is the
given cluster and stage ``k`` runs on rank ``placement.devices[k]``. With ``S`` below the device
count, :meth:`Plan.validate` needs ranks ``0..S-1``, so the result's cluster is the sub-cluster of the
devices the order chose, in their original order: rank ``r`` is the ``r``-th lowest chosen device,
and :attr:`Placement.devices` names them in the given cluster.

**Cost.** Scoring: ``O(|comm models| · |methods| · Σ_S |orders_S| · |counts| · L² · S)`` (one DP
each); simulation: ``O(|comm models| · |methods| · S_max · simulate_top)`` event simulations of
``O(actions · ranks)`` each, plus the GA on ``uedp_bases`` plans. Counts default to one per largest
micro-batch size (:func:`thinned_counts`), about ``2·sqrt(B)``. Measured on the project's 2-core
machine: one DP with ``S = 8`` takes 0.8 ms at ``L = 50``, 14 ms at ``L = 200``, 0.12 s at ``L =
800``; exploring gpt1-14 (batch 64) takes 0.3 s on 2 H100 + 2 V100 and 2.1 s on 4 + 4.
Deterministic: the same arguments give the same plan.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import numpy as np

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.device_orders import DeviceType, Placement, device_types, placed_cluster, placements
from pipetrain.plan.microbatch import SGD_STATE_COPIES, GAConfig, device_memory, memory_need
from pipetrain.plan.microbatch.caps import fits_without_recompute, microbatch_caps
from pipetrain.plan.microbatch.uedp import plan_uedp
from pipetrain.plan.partition.hetero import MemoryLimit, hetero_partition
from pipetrain.plan.plan import Method, Plan, Prediction, StagePlan, equal_sizes
from pipetrain.plan.planner import Candidate, candidate_counts, rank_key
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["BapipeCandidate", "BapipeResult", "CommModel", "Placement", "explore", "thinned_counts"]

log = logging.getLogger(__name__)

_MIB = 2**20
_EQUAL_METHODS = (Method.GPIPE, Method.ONE_F_ONE_B)
_SMALL_GA = GAConfig(population=32, generations=40)

CommModel = Literal["serial", "overlap", "both"]
_COMM_MODELS: dict[str, tuple[bool, ...]] = {"overlap": (True,), "serial": (False,), "both": (True, False)}


@dataclass(frozen=True)
class BapipeCandidate:
    """One simulated option.

    Attributes:
        method: the schedule family.
        n_micro: equal micro-batch count (``uedp``: that of the plan it was planned on).
        placement: the device of each stage, in pipeline order.
        analytic_s: the §4.2 ``T_iter`` that shortlisted it (``uedp``: its base plan's).
        iteration_s: the event simulator's iteration time.
        memory_need_bytes: per stage, predicted peak bytes (state + activations).
        memory_bytes: per stage, its device's memory.
        plan: the plan, with its :class:`Prediction`; ranks index the result's cluster for
            this placement (see the module docstring).
        infeasible: why it cannot run (empty when it can).
    """

    method: Method
    n_micro: int
    placement: Placement
    analytic_s: float
    iteration_s: float
    memory_need_bytes: tuple[int, ...]
    memory_bytes: tuple[int, ...]
    plan: Plan
    infeasible: str = ""

    @property
    def feasible(self) -> bool:
        return not self.infeasible

    @property
    def n_stages(self) -> int:
        return self.plan.n_stages

    @property
    def layer_counts(self) -> tuple[int, ...]:
        return tuple(len(s.layers) for s in self.plan.stages)


@dataclass(frozen=True)
class BapipeResult:
    """What :func:`explore` found.

    Attributes:
        plan: the chosen plan, with its prediction.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it uses fewer devices).
        best: the chosen candidate.
        candidates: every simulated candidate: feasible ones fastest first, then infeasible ones.
        n_scored: partitions scored analytically.
        n_over_memory: (method, S, m, order) options for which no partition fits memory.
    """

    plan: Plan
    cluster: Cluster
    best: BapipeCandidate
    candidates: tuple[BapipeCandidate, ...]
    n_scored: int
    n_over_memory: int


@dataclass(frozen=True)
class _Scored:
    """A partition the DP found, with its analytic time; ``order`` keeps enumeration order for ties."""

    analytic_s: float
    order: int
    method: Method
    n_micro: int
    placement: Placement
    counts: tuple[int, ...]
    overlap: bool  # the comm model that proposed it


def thinned_counts(batch_size: int) -> list[int]:
    """:func:`~pipetrain.plan.planner.candidate_counts`, keeping for each largest micro-batch size
    ``ceil(B / m)`` only the smallest ``m``: more micro-batches of the same largest size only add
    per-action overhead, and under §4.2's ``(m + S - 1) · max_k`` they are never faster."""
    smallest: dict[int, int] = {}
    for m in candidate_counts(batch_size):
        smallest.setdefault(-(-batch_size // m), m)
    return sorted(smallest.values())


class _Tables:
    """Per-layer arrays for the DP, cached by micro-batch size and device (from one CostModel)."""

    def __init__(self, cost: CostModel, layer_names: Sequence[str], batch_size: int) -> None:
        self.cost, self.names, self.batch = cost, tuple(layer_names), batch_size
        names = self.names
        self.state_bytes = np.array([SGD_STATE_COPIES * cost.parameter_bytes((n,)) for n in names], dtype=float)
        self.saved_per_sample = np.array([cost.saved_bytes((n,), 1) for n in names], dtype=float)
        self.layer_s = lru_cache(maxsize=None)(self._layer_s)
        self.cut_s = lru_cache(maxsize=None)(self._cut_s)

    def _layer_s(self, b: int, device: int) -> np.ndarray:
        """``[L]`` forward + backward seconds of each layer on ``b`` samples, without the per-action
        overhead (paid once per stage, not per layer)."""
        c = self.cost
        return np.array([c.forward_s((n,), b, device) + c.backward_s((n,), b, device) - 2 * c.action_overhead_s
                         for n in self.names])

    def _cut_s(self, b: int, src: int, dst: int) -> np.ndarray:
        """``[2, L-1]`` seconds to send the activation of ``b`` samples over each cut (row 0) and its
        gradient back (row 1)."""
        out = [self.cost.output_bytes((n,), b) for n in self.names[:-1]]
        return np.array([[self.cost.transfer_s(x, src, dst) for x in out],
                         [self.cost.transfer_s(x, dst, src) for x in out]])

    def memory(self, method: Method, placement: Placement, sizes: tuple[int, ...]) -> MemoryLimit:
        """Per position: device memory and samples in flight (GPipe all ``B``; 1F1B the first
        ``min(m, S - k)`` micro-batches, the largest ones as :func:`equal_sizes` puts them first)."""
        n = len(placement.devices)
        in_flight = [self.batch if method is Method.GPIPE else sum(sizes[:min(len(sizes), n - k)]) for k in range(n)]
        limits = [self.cost.cluster.devices[d].memory_bytes for d in placement.devices]
        return MemoryLimit(np.array(limits, dtype=float), self.state_bytes, self.saved_per_sample,
                           np.array(in_flight, dtype=float))

    def partition(
        self, method: Method, placement: Placement, sizes: tuple[int, ...], overlap: bool
    ) -> tuple[float, tuple[int, ...]] | None:
        """The §4.4 DP cut and its analytic ``T_iter`` (§4.2; ``overlap``: transfers beside compute);
        None when nothing fits memory."""
        b, d = max(sizes), placement.devices
        costs = np.stack([self.layer_s(b, dev) for dev in d])
        comm = None
        if len(d) > 1:
            both = np.stack([self.cut_s(b, d[k - 1], d[k]) for k in range(1, len(d))])  # [S-1, 2, L-1]
            # The stage overhead c is left out of the costs, and max(x + c, y) = max(x, y - c) + c.
            comm = both.max(axis=1) - 2 * self.cost.action_overhead_s if overlap else both.sum(axis=1)
        found = hetero_partition(costs, comm, self.memory(method, placement, sizes), overlap=overlap)
        if found is None:
            return None
        stage_s = found.bottleneck_s + 2 * self.cost.action_overhead_s
        return (len(sizes) + len(d) - 1) * stage_s, found.counts


def explore(
    *,
    model: str,
    fingerprint: str,
    layer_names: Sequence[str],
    cost: CostModel,
    batch_size: int,
    methods: Sequence[Method] = _EQUAL_METHODS,
    stage_counts: Iterable[int] | None = None,
    counts: Iterable[int] | None = None,
    max_orders: int = 24,
    simulate_top: int = 3,
    uedp_bases: int = 2,
    ga: GAConfig | None = None,
    seed: int = 0,
    comm: CommModel = "both",
    progress: bool = False,
) -> BapipeResult:
    """The fastest feasible plan over methods, stage counts, micro-batch counts and device orders.

    Args:
        model: the model's name (goes into the plan).
        fingerprint: ``LayerGraph.fingerprint()`` of the model.
        layer_names: the layers, in order (``L`` of them).
        cost: profiles (one per device kind for heterogeneous clusters) and the cluster.
        batch_size: samples per mini-batch ``B``.
        methods: among ``gpipe``, ``1f1b`` and ``uedp`` (UMPIPE's unequal micro-batches on the
            best equal plans' stages; needs ``gpipe`` or ``1f1b`` too).
        stage_counts: the stage counts ``S`` to try; default ``1..min(devices, L)``.
        counts: equal micro-batch counts to try; default :func:`thinned_counts`.
        max_orders: device orders tried per stage count (heterogeneous clusters).
        simulate_top: per (method, ``S``, comm model), how many analytically best feasible plans
            to simulate.
        uedp_bases: on how many of the best equal plans to run the ``uedp`` planner.
        ga: the ``uedp`` GA's hyperparameters; default a small budget (32 × 40).
        seed: the ``uedp`` GA's seed.
        comm: how the DP and the score charge transfers: ``"serial"`` §4.2's ``F_k + B_k + C_k``
            (both directions), ``"overlap"`` ``max(F_k + B_k, C_k)`` (one direction, on its own
            link, as pipetrain sends), ``"both"`` each proposes its own shortlist.
        progress: show a rich progress bar on stderr.

    Returns:
        The chosen plan and cluster, and every simulated candidate.

    Raises:
        UserError: a bad method, stage count or batch, or no plan that fits the devices' memory
            (the message says what to change).
    """
    equal, stage_list, count_list = _check_arguments(methods, stage_counts, counts, cost, len(layer_names),
                                                     batch_size)
    if comm not in _COMM_MODELS:
        raise UserError(f"comm model {comm!r} is not one of {', '.join(_COMM_MODELS)}; pick one")
    tables = _Tables(cost, layer_names, batch_size)
    types = device_types(cost, layer_names, batch_size)
    orders = {s: placements(cost.cluster, types, s, max_orders) for s in stage_list}
    with _ticker(progress) as tick:
        tick.phase("scoring partitions", len(equal) * sum(len(o) for o in orders.values()) * len(count_list))
        scored, over = _score_all(tables, equal, orders, count_list, _COMM_MODELS[comm], tick)
        if not scored:
            raise _no_fit_error(tables, types, max(stage_list), batch_size, max_orders)
        shortlist = _shortlist(scored, simulate_top)
        tick.phase("simulating", sum(len(group) for group in shortlist))
        run = _Runner(model, fingerprint, tables, batch_size)
        for group in shortlist:
            _simulate_group(run, group, simulate_top, tick)
        simulated = list(run.simulated.values())
        feasible = _ranked([c for c in simulated if c.feasible])
        if feasible and Method.UEDP in methods:
            bases = _distinct_stages(feasible)[:uedp_bases]
            tick.phase("uedp (tidgap)", len(bases))
            simulated += [run.uedp(c, ga or _SMALL_GA, seed, tick) for c in bases]
    feasible = _ranked([c for c in simulated if c.feasible])
    if not feasible:
        closest = min(simulated, key=lambda c: max(n / h for n, h in zip(c.memory_need_bytes, c.memory_bytes,
                                                                             strict=True)))
        raise UserError(f"no shortlisted plan fits after simulation; the closest ({closest.method.value}, "
                        f"{closest.n_stages} stages, {closest.n_micro} micro-batches) fails with {closest.infeasible}; "
                        f"use a smaller batch (now {batch_size}), more devices or devices with more memory")
    rest = sorted((c for c in simulated if not c.feasible), key=lambda c: c.iteration_s)
    best = feasible[0]
    log.info("bapipe: %d partitions scored (%d options over memory), %d simulated; chosen %s, %d stages, m=%d: "
             "%.6f s", len(scored), over, len(simulated), best.method.value, best.n_stages, best.n_micro,
             best.iteration_s)
    return BapipeResult(best.plan, run.cluster_of(best.placement), best, (*feasible, *rest), len(scored), over)


def _check_arguments(
    methods: Sequence[Method], stage_counts: Iterable[int] | None, counts: Iterable[int] | None,
    cost: CostModel, n_layers: int, batch_size: int,
) -> tuple[list[Method], list[int], list[int]]:
    """The equal methods, stage counts and micro-batch counts to explore; UserError naming a bad one."""
    if batch_size < 1:
        raise UserError(f"batch_size is {batch_size}; it must be at least 1")
    unknown = [m.value for m in methods if m not in (*_EQUAL_METHODS, Method.UEDP)]
    if unknown:
        raise UserError(f"bapipe explores gpipe, 1f1b and uedp, not {', '.join(unknown)}; drop them")
    equal = [m for m in _EQUAL_METHODS if m in methods]
    if not equal:
        raise UserError("uedp plans micro-batches on equal plans' stages; ask for gpipe or 1f1b as well")
    most = min(cost.cluster.n_devices, n_layers)
    stage_list = sorted(set(stage_counts)) if stage_counts is not None else list(range(1, most + 1))
    if not stage_list or not all(1 <= s <= most for s in stage_list):
        raise UserError(f"stage counts {stage_list} must lie in 1..{most} (min of {cost.cluster.n_devices} "
                        f"devices and {n_layers} layers); use fewer stages or more devices")
    count_list = sorted(set(counts)) if counts is not None else thinned_counts(batch_size)
    if not count_list or not all(1 <= m <= batch_size for m in count_list):
        raise UserError(f"micro-batch counts {count_list} must lie in 1..{batch_size} (the batch)")
    return equal, stage_list, count_list


def _score_all(
    tables: _Tables, methods: Sequence[Method], orders: dict[int, list[Placement]], counts: Sequence[int],
    overlaps: Sequence[bool], tick: _Ticker,
) -> tuple[list[_Scored], int]:
    """Every (method, S, m, order)'s DP cut per comm model with its analytic time, and how many
    (method, S, m, order) options fit no memory (the same under every comm model)."""
    scored: list[_Scored] = []
    over = 0
    for method in methods:
        for placement in (p for s in sorted(orders) for p in orders[s]):
            for m in counts:
                tick.advance()
                for overlap in overlaps:
                    found = tables.partition(method, placement, equal_sizes(tables.batch, m), overlap)
                    if found is None:
                        over += 1
                        break
                    scored.append(_Scored(found[0], len(scored), method, m, placement, found[1], overlap))
    return scored, over


def _shortlist(scored: Sequence[_Scored], simulate_top: int) -> list[list[_Scored]]:
    """Per (method, S, comm model), the ``2 · simulate_top`` analytically fastest, best first (room
    for the ones the simulated memory check rejects)."""
    groups: dict[tuple[Method, int, bool], list[_Scored]] = {}
    for s in sorted(scored, key=lambda s: (s.analytic_s, s.order)):
        group = groups.setdefault((s.method, len(s.placement.devices), s.overlap), [])
        if len(group) < 2 * simulate_top:
            group.append(s)
    return list(groups.values())


def _simulate_group(run: _Runner, group: Sequence[_Scored], simulate_top: int, tick: _Ticker) -> None:
    """Simulate a group's shortlist in order until ``simulate_top`` of them fit memory."""
    fitting = 0
    for s in group:
        if fitting == simulate_top:
            break
        tick.advance()
        fitting += run.equal(s).feasible


def _distinct_stages(candidates: Sequence[BapipeCandidate]) -> list[BapipeCandidate]:
    """The first candidate of each stage layout (devices and layer counts): ``uedp`` replaces the
    micro-batches, so two plans on the same stages give it the same problem."""
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], BapipeCandidate] = {}
    for c in candidates:
        seen.setdefault((c.placement.devices, c.layer_counts), c)
    return list(seen.values())


def _ranked(candidates: Sequence[BapipeCandidate]) -> list[BapipeCandidate]:
    return sorted(candidates, key=lambda c: rank_key(Candidate(c.plan, c.iteration_s)))


class _Runner:
    """Builds, simulates and memory-checks plans; caches a CostModel per set of devices used."""

    def __init__(self, model: str, fingerprint: str, tables: _Tables, batch_size: int) -> None:
        self.model, self.fingerprint, self.tables, self.batch = model, fingerprint, tables, batch_size
        self.cost = tables.cost
        self._costs: dict[tuple[int, ...], CostModel] = {}
        # (method, m, devices, layer counts) -> the simulated candidate: both comm models may propose a plan
        self.simulated: dict[tuple[Method, int, tuple[int, ...], tuple[int, ...]], BapipeCandidate] = {}

    def cluster_of(self, placement: Placement) -> Cluster:
        return placed_cluster(self.cost.cluster, placement.devices)[0]

    def cost_of(self, placement: Placement) -> CostModel:
        key = tuple(sorted(placement.devices))
        if key not in self._costs:
            self._costs[key] = self.cost.on(self.cluster_of(placement))
        return self._costs[key]

    def equal(self, s: _Scored) -> BapipeCandidate:
        """Simulate the equal-micro-batch plan of a scored cut (once; kept in :attr:`simulated`)."""
        key = (s.method, s.n_micro, s.placement.devices, s.counts)
        if key not in self.simulated:
            self.simulated[key] = self._simulate_equal(s)
        return self.simulated[key]

    def _simulate_equal(self, s: _Scored) -> BapipeCandidate:
        ranks = placed_cluster(self.cost.cluster, s.placement.devices)[1]
        sizes = equal_sizes(self.batch, s.n_micro)
        stages, first = [], 0
        for k, n in enumerate(s.counts):
            stages.append(StagePlan(self.tables.names[first:first + n], (ranks[k],), sizes, sizes))
            first += n
        plan = Plan(self.model, self.fingerprint, self.batch, s.method, tuple(stages))
        cost = self.cost_of(s.placement)
        timeline = simulate(build_schedule(plan), plan, cost)
        plan = plan.with_prediction(Prediction(
            timeline.iteration_s, timeline.bubble_fraction(), timeline.peak_activation_bytes,
            f"bapipe, simulated: profiles {_sources(cost)}, cluster {cost.cluster.name}",
        ))
        return self._checked(s.method, s.n_micro, s.placement, s.analytic_s, plan)

    def uedp(self, base: BapipeCandidate, ga: GAConfig, seed: int, tick: _Ticker) -> BapipeCandidate:
        """UMPIPE's ``tidgap`` on a feasible equal plan's stages, under memory caps (PAPERS.md §1.12)."""
        tick.advance()
        cost = self.cost_of(base.placement)
        start = replace(base.plan, prediction=None)
        try:
            caps = microbatch_caps(start, cost)
        except UserError as e:
            return replace(base, method=Method.UEDP, infeasible=f"uedp: {e}")
        if not all(fits_without_recompute(start, cost)):
            start = replace(start, recompute=True)
        plan = plan_uedp(start, cost, planner="tidgap", seed=seed, config=ga, caps=caps)
        return self._checked(Method.UEDP, base.n_micro, base.placement, base.analytic_s, plan)

    def _checked(self, method: Method, n_micro: int, placement: Placement, analytic_s: float,
                 plan: Plan) -> BapipeCandidate:
        cost = self.cost_of(placement)
        need, have = memory_need(plan, cost), device_memory(plan, cost)
        over = [k for k in range(plan.n_stages) if need[k] > have[k]]
        why = "" if not over else (
            f"memory: stage {over[0]} needs {need[over[0]] / _MIB:.0f} MiB, its "
            f"{placement.kinds[over[0]]} has {have[over[0]] / _MIB:.0f} MiB")
        assert plan.prediction is not None
        return BapipeCandidate(method, n_micro, placement, analytic_s, plan.prediction.iteration_s, need, have,
                               plan, why)


def _sources(cost: CostModel) -> str:
    return ", ".join(f"{kind}: {p.source} ({p.device})" for kind, p in sorted(cost.profiles.items()))


def _no_fit_error(
    tables: _Tables, types: Sequence[DeviceType], n_stages: int, batch_size: int, max_orders: int
) -> UserError:
    """The error when nothing fits: the most frugal option (1F1B, ``n_stages`` stages, one-sample
    micro-batches) and how much of a device's memory it still needs, from the min–max DP over each
    layer's share ``(state + in_flight · saved) / limit`` of the device at each position."""
    sizes = (1,) * batch_size
    options = []
    for placement in placements(tables.cost.cluster, types, n_stages, max_orders):
        memory = tables.memory(Method.ONE_F_ONE_B, placement, sizes)
        share = (tables.state_bytes[None, :] + memory.in_flight[:, None] * tables.saved_per_sample[None, :]) \
            / memory.limit_bytes[:, None]  # [S, L]
        found = hetero_partition(share)
        assert found is not None  # no memory limit: every cut is allowed
        bounds = (0, *itertools.accumulate(found.counts))
        per_stage = [share[k, a:b].sum() for k, (a, b) in enumerate(itertools.pairwise(bounds))]
        k = int(np.argmax(per_stage))
        options.append((found.bottleneck_s, k, int(memory.limit_bytes[k]), placement))
    fraction, k, limit, placement = min(options, key=lambda o: o[0])
    return UserError(
        f"no plan fits the devices' memory: even the most frugal one (1f1b, {n_stages} stages on "
        f"{'/'.join(placement.kinds)}, micro-batches of 1 sample) needs {fraction:.1%} of stage {k}'s "
        f"{placement.kinds[k]} ({fraction * limit / _MIB:.1f} of {limit / _MIB:.1f} MiB); use a smaller "
        f"batch (now {batch_size}), more devices or devices with more memory"
    )


class _Ticker:
    """Progress over the explorer's phases: a rich bar on stderr, or nothing."""

    def __init__(self, bar: Progress | None) -> None:
        self.bar = bar
        self.task: TaskID | None = None
        self.total = 0

    def phase(self, name: str, total: int) -> None:
        """Close the current phase's bar and open one of ``total`` steps."""
        if self.bar is not None:
            self.finish()
            self.task, self.total = self.bar.add_task(name, total=total), total

    def finish(self) -> None:
        """Show the current phase complete (a group may stop before its whole shortlist)."""
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=self.total)

    def advance(self) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task)


@contextmanager
def _ticker(enabled: bool) -> Iterator[_Ticker]:
    if not enabled:
        yield _Ticker(None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("bapipe: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        ticker = _Ticker(bar)
        yield ticker
        ticker.finish()
