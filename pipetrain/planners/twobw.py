"""The ``2bw`` planner: PipeDream-2BW's search over depth, micro-batch size and recompute.

docs/algorithms.md §3.6 (Narayanan et al., ICML'21, Appendix A)::

    result = plan_2bw(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan.method                      # Method.TWO_BW, weights 2bw
    result.report.width, result.report.depth, result.report.micro_batch, result.report.recompute

The paper searches every ``(w, d)`` with ``w · d = N`` (``d`` stages, each replicated ``w`` times),
every micro-batch size ``b`` and recompute on or off, drops the options over memory and keeps the
fastest. Here, for each option:

* the ``d`` stages are a balanced (min–max) split of the layers' forward + backward time at ``b``
  (:func:`~pipetrain.planners.partition.balanced_partition`), on the first ``d`` devices;
* ``b`` runs over the powers of two dividing the batch with ``m = B / b`` micro-batches between
  0 and :data:`MAX_MICRO`, and ``m >= d`` (2BW needs a version ready before the next batch's first
  forward, docs/algorithms.md §3.5);
* the memory check is the memory model's (:func:`~pipetrain.planners.score.over_memory`: two weight
  versions, optimizer state, stashed activations; recompute keeps only stage inputs);
* throughput is the event simulator's steady state (:func:`~pipetrain.planners.score.score_steady`)
  instead of the paper's closed form: the same terms (the slowest stage's compute and its inbound
  communication, recompute's extra forward) without assuming perfect overlap.

Width: pipetrain's 2BW schedule steps a stage once per batch on the replica that owns the batch's
last micro-batch, so replicated 2BW stages cannot run yet (:meth:`~pipetrain.plan.plan.Plan.validate`
refuses them). The planner therefore keeps ``w = 1`` and searches depth ``d = 1 … N`` (a
shallower pipeline leaves devices idle; it runs on the sub-cluster of the devices it uses); each
``w > 1`` pair is listed in the report's ``skipped`` with that reason. Recompute is tried only when
the option without it is over memory: it adds a forward per backward and is never faster.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method, MethodSpec, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.partition import balanced_partition
from pipetrain.planners.score import over_memory, score_steady
from pipetrain.planners.spec import planned_methods

__all__ = ["MAX_MICRO", "TwoBWReport", "micro_batch_sizes", "plan_2bw", "two_bw_plan", "twobw_plans"]

log = logging.getLogger(__name__)

MAX_MICRO = 64
"""The most micro-batches per batch the planner simulates (smaller micro-batches only add overhead)."""

_NOT_REPLICATED = "2bw cannot run replicated stages yet (one STEP per batch on one replica); width kept at 1"


@dataclass(frozen=True)
class TwoBWReport:
    """The 2BW planner's account of its answer.

    Attributes:
        width: replicas per stage ``w`` (1: see the module docstring).
        depth: stages ``d``.
        micro_batch: samples per micro-batch ``b``.
        recompute: whether the winner recomputes activations.
        skipped: ``(option, why)`` for the options with no runnable plan (over memory, width > 1).
    """

    width: int
    depth: int
    micro_batch: int
    recompute: bool
    skipped: tuple[tuple[str, str], ...]


def micro_batch_sizes(batch_size: int, depth: int, smallest: int = 1) -> list[int]:
    """The powers of two ``b >= smallest`` (a model with BatchNorm: 2) dividing the batch with
    ``depth <= B / b <= MAX_MICRO``, largest first."""
    sizes, b = [], 1
    while b <= batch_size:
        if b >= smallest and batch_size % b == 0 and depth <= batch_size // b <= MAX_MICRO:
            sizes.append(b)
        b *= 2
    return sizes[::-1]


def two_bw_plan(problem: PlanningProblem, depth: int, micro_batch: int, recompute: bool) -> Plan:
    """The 2BW plan of ``depth`` balanced stages on ranks ``0..depth-1`` with micro-batches of ``micro_batch``."""
    names, cost = problem.layer_names, problem.cost
    counts = balanced_partition([cost.layer_work_s(n, micro_batch, 0) for n in names], depth)
    sizes = equal_sizes(problem.batch_size, problem.batch_size // micro_batch)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(names[first:first + count], (k,), sizes, sizes))
        first += count
    model = problem.model
    return Plan(model.name, model.fingerprint, problem.batch_size, Method.TWO_BW, tuple(stages),
                recompute=recompute, weights=WeightPolicy.TWO_BW)


def _option(problem: PlanningProblem, depth: int, b: int, skipped: list[tuple[str, str]]) -> Candidate | None:
    """The fastest fitting plan at depth ``depth`` and micro-batch ``b`` (recompute only when needed)."""
    sub, _ = placed_cluster(problem.cost.cluster, range(depth))
    sub_cost = problem.cost.on(sub)
    for recompute in (False, True):
        label = f"2bw w=1 d={depth} b={b}{' recompute' if recompute else ''}"
        plan = two_bw_plan(problem, depth, b, recompute)
        why = over_memory(plan, sub_cost, problem.optimizer)
        if not why:
            return score_steady(plan, sub_cost, label=label)
        skipped.append((label, f"over memory: {why}"))
    return None


def twobw_plans(spec: MethodSpec) -> bool:
    """The methods the 2bw planner plans: those that double-buffer weights (PipeDream-2BW's two versions)."""
    return WeightPolicy.TWO_BW in spec.weights


def _check(problem: PlanningProblem) -> None:
    method = problem.constraints.method
    if method is not None and not twobw_plans(METHODS[method]):
        own = " or ".join(m.value for m in planned_methods(twobw_plans))
        raise UserError(f"the 2bw planner plans method {own}, not {method.value}; use --method {own}, or another "
                        "planner (pipedream, balanced) for that method")


def plan_2bw(problem: PlanningProblem) -> PlanningResult:
    """The fastest 2BW plan that fits, over depth, micro-batch size and recompute (module docstring).

    Returns:
        The plan (method ``2bw``) on the sub-cluster of the devices it uses, every fitting option
        fastest first (``iteration_s``: steady-state seconds per batch) and a :class:`TwoBWReport`.

    Raises:
        UserError: a method other than 2bw was fixed, or no option fits the devices' memory.
    """
    _check(problem)
    n = problem.cost.cluster.n_devices
    skipped = [(f"w={w} d={n // w}", _NOT_REPLICATED) for w in range(2, n + 1) if n % w == 0]
    candidates: list[Candidate] = []
    for depth in range(1, min(n, len(problem.layer_names)) + 1):
        for b in micro_batch_sizes(problem.batch_size, depth, problem.smallest_microbatch):
            found = _option(problem, depth, b, skipped)
            if found is not None:
                candidates.append(found)
    if not candidates:
        reasons = "; ".join(f"{opt}: {why}" for opt, why in skipped[-3:])
        raise UserError(f"the 2bw planner found no plan that fits ({reasons}); use a smaller batch, more devices "
                        "or devices with more memory")
    candidates.sort(key=rank_key)
    best = candidates[0]
    assert best.cluster is not None
    b = best.plan.batch_size // len(best.plan.stages[0].forward_sizes)
    log.info("2bw: chose d=%d b=%d recompute=%s: %.6f s per batch", best.plan.n_stages, b, best.plan.recompute,
             best.iteration_s)
    report = TwoBWReport(1, best.plan.n_stages, b, best.plan.recompute, tuple(skipped))
    return PlanningResult("2bw", best.plan, best.cluster, tuple(candidates), report)
