"""BaPipe: explore method × stage count × micro-batches × device order × balanced partition.

docs/algorithms.md §4 (BaPipe, Zhao et al. 2020, arXiv 2012.12544; §4.2–4.3 are pipetrain's reconstruction)::

    cost = CostModel({"h100": estimate_profile(graph, "h100", 64),
                      "v100": estimate_profile(graph, "v100", 64)}, cluster)
    result = explore(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    print(bapipe_table(result))          # pipetrain.viz.plan_tables

For every method (``gpipe``, ``1f1b``), stage count ``S`` in ``1..min(devices, layers)``,
micro-batch count ``m`` and device order, the heterogeneity-aware DP of §4.3
(:func:`~pipetrain.planners.partition.hetero.hetero_partition`) cuts the layers so that the
bottleneck ``max_k (F_k + B_k + C_k)`` is smallest and every stage fits its device: GPipe keeps all
``B`` samples' activations, 1F1B the first ``min(m, S - k)`` micro-batches on stage ``k`` (0-based);
parameters count :func:`~pipetrain.plan.memory.parameter_copies` times under the problem's
optimizer. Each cut is scored with the analytic iteration time of §4.2, ``T_iter = (m + S - 1) ·
max_k (F_k + B_k + C_k)``, with ``F_k``, ``B_k`` including the runtime's per-action overhead and
``C_k`` the activation into stage ``k`` and its gradient back (``comm="serial"``). pipetrain's
simulator and runtime send on a link of their own while the stage computes, so a slow link is rather
a pipeline resource beside the stages: ``comm="overlap"`` cuts and scores with ``max(F_k + B_k,
C_k)``, ``C_k`` one direction. Neither model ranks plans as the simulator does
(``benchmarks/bench_hetero.py`` ablates them: each finds the faster plan for some model), so by
default (``comm="both"``) each model proposes its own partitions. Per (method, ``S``, comm model)
the ``simulate_top`` best are simulated by the event simulator, the truth, and checked with
:func:`~pipetrain.simulate.memory.memory_need` against
:func:`~pipetrain.simulate.memory.device_memory`; a shortlisted plan that does not fit is kept in
the report, marked, and the next one is tried. With ``uedp`` asked for, UMPIPE's ``tidgap`` planner
(small GA) runs on the stages of the best few feasible plans and its plan is kept when faster. The
fastest feasible simulated plan wins (ties: less memory, fewer micro-batches).

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
  ``O(actions · ranks)`` each, plus the GA on ``uedp_bases`` plans. Counts default to one per
  largest micro-batch size (:func:`~pipetrain.planners.counts.thinned_counts`), about ``2·sqrt(B)``.
  Measured on the project's 2-core machine: one DP with ``S = 8`` takes 0.8 ms at ``L = 50``, 14 ms
  at ``L = 200``, 0.12 s at ``L = 800``; exploring gpt1-14 (batch 64) takes 0.3 s on 2 H100 + 2 V100
  and 2.1 s on 4 + 4. Deterministic: the same arguments give the same plan."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Backward, Method, MethodSpec, SizeRule, StageGraph
from pipetrain.plan.placement import Placement as StagePlacement
from pipetrain.plan.plan import equal_sizes
from pipetrain.planners.bapipe.candidates import BapipeCandidate, BapipeResult, Proposal
from pipetrain.planners.bapipe.runner import Runner
from pipetrain.planners.bapipe.tables import LayerTables, no_fit_error
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.counts import thinned_counts
from pipetrain.planners.device_orders import Placement, device_types, placed_cluster, placements
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.progress import PhaseTicker, phase_ticker
from pipetrain.planners.report import PlanPart
from pipetrain.planners.score import profile_noise, tie_limit
from pipetrain.planners.spec import planned_methods

__all__ = ["CommModel", "bapipe_layout", "bapipe_plans", "explore", "plan_bapipe"]

log = logging.getLogger(__name__)


def bapipe_plans(spec: MethodSpec) -> bool:
    """The methods BaPipe explores: one stage per rank along a chain, a flush per batch, the backward
    fused and gradients across stages (its DP's memory and time model, §4.2–4.3): gpipe and 1f1b with
    equal micro-batches, and uedp (UMPIPE's unequal ones, each stage its own partition per pass) on the
    best equal plans' stages."""
    return (spec.placement is StagePlacement.SINGLE and spec.graph is StageGraph.CHAIN and spec.flush
            and spec.backward is Backward.FUSED and spec.gradients_cross_stages)


def _unequal(spec: MethodSpec) -> bool:
    """Planned by a micro-batch planner on an equal plan's stages (each stage its own partition per pass)."""
    return spec.sizes is SizeRule.PER_PASS


_SMALL_GA = GAConfig(population=32, generations=40)

CommModel = Literal["serial", "overlap", "both"]
_COMM_MODELS: dict[str, tuple[bool, ...]] = {"overlap": (True,), "serial": (False,), "both": (True, False)}


def explore(
    problem: PlanningProblem,
    *,
    methods: Sequence[Method] | None = None,
    stage_counts: Iterable[int] | None = None,
    counts: Iterable[int] | None = None,
    max_orders: int = 24,
    simulate_top: int = 3,
    uedp_bases: int = 2,
    comm: CommModel = "both",
) -> BapipeResult:
    """The fastest feasible plan over methods, stage counts, micro-batch counts and device orders.

    Args:
        problem: the model, cost model, batch ``B``, optimizer; constraints: the stage count
            (``n_stages``, unless ``stage_counts``), the ``uedp`` GA's seed and budget (default 32 × 40).
        methods: among those of :func:`bapipe_plans`: ``gpipe``, ``1f1b`` and ``uedp`` (UMPIPE's
            unequal micro-batches on the best equal plans' stages; needs ``gpipe`` or ``1f1b`` too);
            default the equal ones.
        stage_counts: the stage counts ``S`` to try; default ``1..min(devices, L)``.
        counts: equal micro-batch counts to try; default :func:`~pipetrain.planners.counts.thinned_counts`.
        max_orders: device orders tried per stage count (heterogeneous clusters).
        simulate_top: per (method, ``S``, comm model), how many analytically best feasible plans
            to simulate.
        uedp_bases: on how many of the best equal plans to run the ``uedp`` planner.
        comm: how the DP and the score charge transfers: ``"serial"`` §4.2's ``F_k + B_k + C_k``
            (both directions), ``"overlap"`` ``max(F_k + B_k, C_k)`` (one direction, on its own
            link, as pipetrain sends), ``"both"`` each proposes its own shortlist.

    Raises:
        UserError: a bad method, stage count or comm model, or no plan that fits the devices'
            memory (the message says what to change).
    """
    cost, batch = problem.cost, problem.batch_size
    equal, stage_list, count_list = _check_arguments(problem, methods, stage_counts, counts, comm)
    tables = LayerTables(cost, problem.layer_names, batch, problem.optimizer)
    types = device_types(cost, problem.layer_names, batch)
    orders = {s: placements(cost.cluster, types, s, max_orders) for s in stage_list}
    with phase_ticker("bapipe", problem.progress) as tick:
        tick.phase("scoring partitions", len(equal) * sum(len(o) for o in orders.values()) * len(count_list))
        proposals, over = _score_all(tables, equal, orders, count_list, _COMM_MODELS[comm], tick)
        if not proposals:
            raise no_fit_error(tables, types, max(stage_list), batch, max_orders)
        run = Runner(problem, tables)
        unequal = any(_unequal(METHODS[m]) for m in methods or ())
        _simulate_shortlist(run, proposals, simulate_top, uedp_bases if unequal else 1, tick)
        simulated = list(run.simulated.values())
        if unequal:
            simulated += _unequal_plans(run, simulated, uedp_bases, tick)
    return _result(run, simulated, len(proposals), over)


def plan_bapipe(problem: PlanningProblem) -> PlanningResult:
    """The registry's ``bapipe``: :func:`explore` over every method of :func:`bapipe_plans`, as a PlanningResult."""
    found = explore(problem, methods=planned_methods(bapipe_plans))
    candidates = tuple(c.as_candidate(placed_cluster(problem.cost.cluster, c.placement.devices)[0])
                       for c in found.candidates)
    return PlanningResult("bapipe", found.plan, found.cluster, candidates, found)


def _simulate_shortlist(run: Runner, proposals: Sequence[Proposal], simulate_top: int, keep: int,
                        tick: PhaseTicker) -> None:
    """Simulate each group's shortlist (:func:`_simulate_group`), skipping every proposal whose lower
    bound is slower than the ``keep``-th fastest feasible stage layout simulated so far (``keep``:
    the bases ``uedp`` needs, else 1) beyond a 3-digit tie or the profiles' noise: so the fastest
    plans and ``uedp``'s bases are those of simulating the whole shortlist (issue 30)."""
    shortlist = _shortlist(proposals, simulate_top)
    tick.phase("simulating", sum(len(group) for group in shortlist))
    noise = profile_noise(run.cost)
    for group in shortlist:
        _simulate_group(run, group, simulate_top, lambda: _limit(run.simulated.values(), keep, noise), tick)


def _limit(simulated: Iterable[BapipeCandidate], keep: int, noise: float) -> float:
    """The slowest time still worth simulating: a tie (:func:`~pipetrain.planners.score.tie_limit`)
    of the ``keep``-th fastest feasible stage layout (devices and layer counts), inf before ``keep``."""
    best: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    for c in simulated:
        if c.feasible:
            key = (c.placement.devices, c.layer_counts)
            best[key] = min(best.get(key, math.inf), c.iteration_s)
    times = sorted(best.values())
    return tie_limit(times[keep - 1], noise) if len(times) >= keep else math.inf


def bapipe_layout(result: PlanningResult) -> tuple[object, ...]:
    """The plan, then BaPipe's exploration (its own table, :func:`pipetrain.viz.plan_tables.bapipe_table`)."""
    return PlanPart(result.plan), result.report


def _unequal_plans(run: Runner, simulated: Sequence[BapipeCandidate], uedp_bases: int,
             tick: PhaseTicker) -> list[BapipeCandidate]:
    """``uedp`` (tidgap) on the stages of the ``uedp_bases`` best feasible equal plans."""
    feasible = _ranked([c for c in simulated if c.feasible])
    bases = _distinct_stages(feasible)[:uedp_bases]
    tick.phase("uedp (tidgap)", len(bases))
    c = run.problem.constraints
    found = []
    for base in bases:
        tick.advance()
        found.append(run.uedp(base, c.ga or _SMALL_GA, c.seed))
    return found


def _result(run: Runner, simulated: Sequence[BapipeCandidate], n_scored: int, over: int) -> BapipeResult:
    """The fastest feasible candidate, or the error naming the closest one."""
    feasible = _ranked([c for c in simulated if c.feasible])
    if not feasible:
        closest = min(simulated, key=lambda c: max(n / h for n, h in zip(c.memory_need_bytes, c.memory_bytes,
                                                                             strict=True)))
        raise UserError(f"no shortlisted plan fits after simulation; the closest ({closest.method.value}, "
                        f"{closest.n_stages} stages, {closest.n_micro} micro-batches) fails with {closest.infeasible}; "
                        f"use a smaller batch (now {run.problem.batch_size}), more devices or devices with more "
                        "memory")
    rest = sorted((c for c in simulated if not c.feasible), key=lambda c: c.iteration_s)
    best = feasible[0]
    log.info("bapipe: %d partitions scored (%d options over memory), %d simulated; chosen %s, %d stages, m=%d: "
             "%.6f s", n_scored, over, len(simulated), best.method.value, best.n_stages, best.n_micro,
             best.iteration_s)
    return BapipeResult(best.plan, run.cluster_of(best.placement), best, (*feasible, *rest), n_scored, over)


def _check_arguments(
    problem: PlanningProblem, methods: Sequence[Method] | None, stage_counts: Iterable[int] | None,
    counts: Iterable[int] | None, comm: str,
) -> tuple[list[Method], list[int], list[int]]:
    """The equal methods, stage counts and micro-batch counts to explore; UserError naming a bad one."""
    cost, n_layers, batch_size = problem.cost, len(problem.layer_names), problem.batch_size
    if stage_counts is None and problem.constraints.n_stages is not None:
        stage_counts = [problem.constraints.n_stages]
    if comm not in _COMM_MODELS:
        raise UserError(f"comm model {comm!r} is not one of {', '.join(_COMM_MODELS)}; pick one")
    planned = planned_methods(bapipe_plans)
    given = [m for m in planned if not _unequal(METHODS[m])] if methods is None else list(methods)
    unknown = [m.value for m in given if not bapipe_plans(METHODS[m])]
    if unknown:
        raise UserError(f"bapipe explores {', '.join(m.value for m in planned[:-1])} and {planned[-1].value}, not "
                        f"{', '.join(unknown)}; drop them")
    equal = [m for m in planned if m in given and not _unequal(METHODS[m])]
    if not equal:
        names = " or ".join(m.value for m in planned if not _unequal(METHODS[m]))
        unequal = " and ".join(m.value for m in given)
        raise UserError(f"{unequal} plans micro-batches on equal plans' stages; ask for {names} as well")
    most = min(cost.cluster.n_devices, n_layers)
    stage_list = sorted(set(stage_counts)) if stage_counts is not None else list(range(1, most + 1))
    if not stage_list or not all(1 <= s <= most for s in stage_list):
        raise UserError(f"stage counts {stage_list} must lie in 1..{most} (min of {cost.cluster.n_devices} "
                        f"devices and {n_layers} layers); use fewer stages or more devices")
    count_list = sorted(set(counts)) if counts is not None else thinned_counts(batch_size, problem.smallest_microbatch)
    if not count_list or not all(1 <= m <= batch_size for m in count_list):
        raise UserError(f"micro-batch counts {count_list} must lie in 1..{batch_size} (the batch)")
    return equal, stage_list, count_list


def _score_all(
    tables: LayerTables, methods: Sequence[Method], orders: dict[int, list[Placement]], counts: Sequence[int],
    overlaps: Sequence[bool], tick: PhaseTicker,
) -> tuple[list[Proposal], int]:
    """Every (method, S, m, order)'s DP cut per comm model with its analytic time, and how many
    (method, S, m, order) options fit no memory (the same under every comm model)."""
    scored: list[Proposal] = []
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
                    scored.append(Proposal(found[0], len(scored), method, m, placement, found[1], overlap))
    return scored, over


def _shortlist(scored: Sequence[Proposal], simulate_top: int) -> list[list[Proposal]]:
    """Per (method, S, comm model), the ``2 · simulate_top`` analytically fastest, best first (room
    for the ones the simulated memory check rejects)."""
    groups: dict[tuple[Method, int, bool], list[Proposal]] = {}
    for s in sorted(scored, key=lambda s: (s.analytic_s, s.order)):
        group = groups.setdefault((s.method, len(s.placement.devices), s.overlap), [])
        if len(group) < 2 * simulate_top:
            group.append(s)
    return list(groups.values())


def _simulate_group(run: Runner, group: Sequence[Proposal], simulate_top: int, limit: Callable[[], float],
                    tick: PhaseTicker) -> None:
    """Simulate a group's shortlist in order until ``simulate_top`` of them fit memory; a proposal
    whose lower bound exceeds ``limit()`` is skipped and does not count."""
    fitting = 0
    for s in group:
        if fitting == simulate_top:
            break
        tick.advance()
        if run.lower_bound_s(s) > limit():
            continue
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
