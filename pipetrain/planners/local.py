"""The ``local`` planner: stages for PPLL's local learning, balanced with their auxiliary heads.

    cost = api.local_cost(graph, profile, cluster, "dgl")          # heads in the cost model
    heads = Constraints(params=LocalParams("dgl", queue_depth=2))
    result = run_planner("local", PlanningProblem(ModelRef.of(graph), cost, batch_size=64, constraints=heads))

With method ``local`` (docs/algorithms.md §6) every micro-batch runs F, local B and STEP on each
stage, and every stage but the last also runs its auxiliary head, so a stage ``[j, i)`` costs, per
micro-batch of ``b`` samples::

    sum over its layers of (forward + backward + step)  +  head after layer i-1 (forward + backward + step)
      +  host seconds of receiving its input (j > 0) and of sending its output (i < L)

(the last stage has no head; it uses the model's own loss; the messages' seconds are the cost
model's :class:`~pipetrain.cost.MessageHost`, 0 by default). For each candidate micro-batch count
the planner cuts the layers by an exact min–max partition of that cost (:func:`min_max_cuts`, a
stage paying where it starts and where it ends), builds the local plan, simulates it
(:func:`~pipetrain.planners.score.score`, heads counted) and keeps the fastest. An expensive head,
or a large message, thus pushes layers off its stage. The cost model must hold the heads
(:meth:`~pipetrain.cost.CostModel.with_heads`); without them the heads cost nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_KINDS
from pipetrain.plan.methods import LocalParams, Method, MethodSpec, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Candidate, ModelRef, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.counts import candidate_counts
from pipetrain.planners.report import CandidatesPart, NotePart, PlanPart
from pipetrain.planners.score import score

__all__ = ["build_local_plan", "local_layout", "local_plans", "min_max_cuts", "plan_local"]


def local_plans(spec: MethodSpec) -> bool:
    """The methods the local planner plans: those whose stages train on local losses, no gradient
    crossing stages (PPLL's local learning)."""
    return not spec.gradients_cross_stages


def _stage_costs(model: ModelRef, cost: CostModel, b: int) -> tuple[list[float], list[float], list[float]]:
    """Per layer on ``b`` samples: its forward + backward + step seconds; what a stage starting with it
    pays (receiving its input); what a stage ending with it pays (the head after it, sending its output)."""
    names = model.layer_names
    works = [cost.layer_work_s(n, b, 0) + cost.step_s((n,), 0) for n in names]
    starts = [0.0] + [cost.recv_host_s(cost.input_bytes((n,), b)) for n in names[1:]]
    ends = [cost.head_forward_s((n,), b, 0) + cost.head_backward_s((n,), b, 0) + cost.head_step_s((n,), 0)
            + cost.send_host_s(cost.output_bytes((n,), b)) for n in names[:-1]]
    return works, starts, [*ends, 0.0]


def min_max_cuts(works: Sequence[float], starts: Sequence[float], ends: Sequence[float],
                 n_stages: int) -> tuple[int, ...]:
    """Layer counts (each >= 1, summing to ``L``) of ``n_stages`` stages that minimise the largest stage
    cost, a stage of layers ``j..i-1`` costing ``sum(works[j:i]) + starts[j] + ends[i-1]``: the exact
    dynamic programme of :func:`~pipetrain.planners.partition.balanced_partition` (O(K · L²), ties to
    the earliest boundary, so without ``starts`` the same cuts), with a cost where a stage starts too.

    Raises:
        UserError: more stages than layers.
    """
    n = len(works)
    if not 1 <= n_stages <= n:
        raise UserError(f"cannot cut {n} layers into {n_stages} stages; use between 1 and {n} stages")
    prefix = [0.0, *itertools.accumulate(works)]
    best = [[float("inf")] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j] + starts[j] + ends[i - 1])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    sizes, i = [], n
    for k in range(n_stages, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(sizes))


def build_local_plan(model: ModelRef, cost: CostModel, *, aux: str, queue_depth: int, n_stages: int,
                     batch_size: int, n_micro: int) -> Plan:
    """The local plan with ``n_micro`` equal micro-batches, stage ``k`` on rank ``k``, balanced with its head."""
    if n_stages > cost.cluster.n_devices:
        raise UserError(f"{n_stages} stages need {n_stages} ranks but the cluster has {cost.cluster.n_devices}; "
                        "use fewer stages or more ranks")
    sizes = equal_sizes(batch_size, n_micro)
    counts = min_max_cuts(*_stage_costs(model, cost, max(sizes)), n_stages)
    stages, first = [], 0
    for k, count in enumerate(counts):
        stages.append(StagePlan(model.layer_names[first:first + count], (k,), sizes, sizes))
        first += count
    return Plan(model.name, model.fingerprint, batch_size, Method.LOCAL, tuple(stages), weights=WeightPolicy.LOCAL,
                params=LocalParams(aux, queue_depth))


def _heads(problem: PlanningProblem) -> LocalParams:
    """The heads and queue depth the problem asks for (``constraints.params``), else linear heads with
    the default depth (a model's own default heads need its graph: :func:`pipetrain.api.plan` gives them).

    Raises:
        UserError: parameters of another method.
    """
    params = problem.constraints.params
    if params is None:
        return LocalParams(AUX_KINDS[0])
    if not isinstance(params, LocalParams):
        raise UserError(f"the local planner takes local learning's heads and queue depth (LocalParams), not "
                        f"{type(params).__name__}; pass constraints.params=LocalParams(aux, queue_depth)")
    params.check(Method.LOCAL.value)
    return params


def plan_local(problem: PlanningProblem) -> PlanningResult:
    """The fastest local plan over the micro-batch counts (``constraints.n_micro``, default: search),
    one stage per device (``constraints.n_stages``), with the heads and queue depth of
    ``constraints.params`` (:class:`~pipetrain.plan.methods.LocalParams`), with every candidate (module
    docstring)."""
    c, heads = problem.constraints, _heads(problem)
    n_stages = c.n_stages or min(problem.cost.cluster.n_devices, len(problem.model.layer_names))
    candidates: list[Candidate] = []
    smallest = problem.smallest_microbatch
    for m in [c.n_micro] if c.n_micro is not None else candidate_counts(problem.batch_size, smallest=smallest):
        plan = build_local_plan(problem.model, problem.cost, aux=heads.aux, queue_depth=heads.queue_depth,
                                n_stages=n_stages, batch_size=problem.batch_size, n_micro=m)
        candidates.append(score(plan, problem.cost, label=f"local m={m}"))
    candidates.sort(key=rank_key)
    return PlanningResult("local", candidates[0].plan, problem.cost.cluster, tuple(candidates))


def local_layout(result: PlanningResult) -> tuple[object, ...]:
    """What local learning chose (heads, queue depth, predicted time), the plan and the candidates."""
    params = result.plan.params
    assert isinstance(params, LocalParams)
    chosen = (f"local learning ({params.aux} heads, queues of {params.queue_depth}), stages balanced with their "
              f"heads: predicted {result.candidates[0].iteration_s * 1e3:.2f} ms per iteration")
    return NotePart(chosen), PlanPart(result.plan), CandidatesPart(result.candidates)
