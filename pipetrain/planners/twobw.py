"""The ``2bw`` planner: PipeDream-2BW's search over width × depth, micro-batch size and recompute.

docs/algorithms.md §3.6 (Narayanan et al., ICML'21, Appendix A)::

    result = plan_2bw(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan.method                      # Method.TWO_BW, weights 2bw
    result.report.width, result.report.depth, result.report.micro_batch, result.report.recompute
    result.plan.stages[0].ranks             # (0, 1) for w = 2: stage k on ranks k·w … k·w + w − 1

The paper searches every ``(w, d)`` with ``w · d = N`` (``d`` stages, each replicated ``w`` times),
every micro-batch size ``b`` and recompute on or off, drops the options over memory and keeps the
fastest. Here, for each option:

* the ``d`` stages are a balanced (min–max) split of the layers' forward + backward time at ``b``
  (:func:`~pipetrain.planners.partition.balanced_partition`), each on ``w`` of the first ``w · d``
  devices (below);
* ``b`` runs over the powers of two dividing the batch with ``m = B / b`` micro-batches, a multiple
  of ``w``, between ``w · d`` and :data:`MAX_MICRO` (2BW needs a version ready before the next
  batch's first forward, docs/algorithms.md §3.5; each replica keeps ``d − k`` in flight);
* the memory check is the memory model's (:func:`~pipetrain.planners.score.over_memory`: two weight
  versions, optimizer state, stashed activations; recompute keeps only stage inputs);
* throughput is the event simulator's steady state (:func:`~pipetrain.planners.score.score_steady`)
  instead of the paper's closed form: the same terms (the slowest stage's compute and its inbound
  communication, the replicas' all-reduce ``T_i^comm``, recompute's extra forward) without assuming
  perfect overlap.

Width (the paper's parallel pipelines): stage ``k`` of a ``w × d`` plan runs on ranks ``k·w …
k·w + w − 1`` (a stage's replicas side by side, so their gradient all-reduce stays inside a server
when ``w`` fits one, as the paper places them); the replicas take micro-batches round-robin
(1F1B-RR) and each steps once per batch on the same version, the stage's gradients summed over them
(docs/algorithms.md §3.5). The simulator prices that all-reduce in every replica's STEP. The pairs
searched are the paper's ``w · d = N`` and, as straight pipelines (``w = 1``), every depth
``d = 1 … N`` (a shallower pipeline leaves devices idle and runs on the sub-cluster of those it
uses; it wins when the layers do not split ``N`` ways or the all-reduce is dear). With width ``w`` a
batch needs ``m`` a multiple of ``w`` with ``m >= w · d`` (the paper's ``m >= d`` per pipeline). A
pair without such a micro-batch size is listed in the report's ``skipped``. Recompute is tried only
when the option without it is over memory: it adds a forward per backward and is never faster.

Cost: ``O(N)`` pairs (the divisors of ``N``, plus ``N`` depths at width 1), each at most
``log₂ B`` micro-batch sizes, each two event simulations of a few batches.
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

__all__ = ["MAX_MICRO", "TwoBWReport", "micro_batch_sizes", "plan_2bw", "two_bw_plan", "twobw_plans",
           "widths_and_depths"]

log = logging.getLogger(__name__)

MAX_MICRO = 64
"""The most micro-batches per batch the planner simulates (smaller micro-batches only add overhead)."""


@dataclass(frozen=True)
class TwoBWReport:
    """The 2BW planner's account of its answer.

    Attributes:
        width: replicas per stage ``w``.
        depth: stages ``d``.
        micro_batch: samples per micro-batch ``b``.
        recompute: whether the winner recomputes activations.
        skipped: ``(option, why)`` for the options with no runnable plan (over memory, no micro-batch
            size for the width and depth).
    """

    width: int
    depth: int
    micro_batch: int
    recompute: bool
    skipped: tuple[tuple[str, str], ...]


def micro_batch_sizes(batch_size: int, depth: int, smallest: int = 1, width: int = 1) -> list[int]:
    """The powers of two ``b >= smallest`` (a model with BatchNorm: 2) dividing the batch into ``m = B / b``
    micro-batches, a multiple of ``width``, with ``width · depth <= m <= MAX_MICRO``; largest first."""
    sizes, b = [], 1
    while b <= batch_size:
        m = batch_size // b
        if b >= smallest and batch_size % b == 0 and m % width == 0 and width * depth <= m <= MAX_MICRO:
            sizes.append(b)
        b *= 2
    return sizes[::-1]


def widths_and_depths(n_devices: int, n_layers: int) -> list[tuple[int, int]]:
    """The ``(w, d)`` pairs searched: ``w · d = N`` (the paper's), and every depth ``d <= N`` at width 1;
    ``d`` at most the layers."""
    pairs = {(n_devices // d, d) for d in range(1, n_devices + 1) if n_devices % d == 0}
    pairs |= {(1, d) for d in range(1, n_devices + 1)}
    return sorted((w, d) for w, d in pairs if d <= n_layers)


def two_bw_plan(problem: PlanningProblem, depth: int, micro_batch: int, recompute: bool, width: int = 1) -> Plan:
    """The 2BW plan of ``depth`` balanced stages, stage ``k`` on ranks ``k·width … k·width + width − 1``,
    with micro-batches of ``micro_batch``."""
    names, cost = problem.layer_names, problem.cost
    counts = balanced_partition([cost.layer_work_s(n, micro_batch, 0) for n in names], depth)
    sizes = equal_sizes(problem.batch_size, problem.batch_size // micro_batch)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(names[first:first + count], tuple(range(k * width, (k + 1) * width)), sizes, sizes,
                                recompute))
        first += count
    model = problem.model
    return Plan(model.name, model.fingerprint, problem.batch_size, Method.TWO_BW, tuple(stages),
                weights=WeightPolicy.TWO_BW)


def _option(problem: PlanningProblem, width: int, depth: int, b: int,
            skipped: list[tuple[str, str]]) -> Candidate | None:
    """The fastest fitting plan of ``width × depth`` at micro-batch ``b`` (recompute only when needed)."""
    sub, _ = placed_cluster(problem.cost.cluster, range(width * depth))
    sub_cost = problem.cost.on(sub)
    for recompute in (False, True):
        label = f"2bw w={width} d={depth} b={b}{' recompute' if recompute else ''}"
        plan = two_bw_plan(problem, depth, b, recompute, width)
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
    """The fastest 2BW plan that fits, over width × depth, micro-batch size and recompute (module docstring).

    Returns:
        The plan (method ``2bw``) on the sub-cluster of the devices it uses, every fitting option
        fastest first (``iteration_s``: steady-state seconds per batch) and a :class:`TwoBWReport`.

    Raises:
        UserError: a method other than 2bw was fixed, or no option fits the devices' memory.
    """
    _check(problem)
    skipped: list[tuple[str, str]] = []
    candidates: list[Candidate] = []
    for width, depth in widths_and_depths(problem.cost.cluster.n_devices, len(problem.layer_names)):
        sizes = micro_batch_sizes(problem.batch_size, depth, problem.smallest_microbatch, width)
        if not sizes:
            skipped.append((f"2bw w={width} d={depth}", f"no micro-batch size gives a multiple of {width} "
                            f"between {width * depth} and {MAX_MICRO} micro-batches of the batch of "
                            f"{problem.batch_size}"))
        for b in sizes:
            found = _option(problem, width, depth, b, skipped)
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
    width = len(best.plan.stages[0].ranks)
    recompute = bool(best.plan.recompute_stages)
    log.info("2bw: chose w=%d d=%d b=%d recompute=%s: %.6f s per batch", width, best.plan.n_stages, b,
             recompute, best.iteration_s)
    report = TwoBWReport(width, best.plan.n_stages, b, recompute, tuple(skipped))
    return PlanningResult("2bw", best.plan, best.cluster, tuple(candidates), report)
