"""Schedule generators: one per method, plain numbers in, compute-only Schedule out (STYLE.md L4).

A generator emits, for every rank, the order of its F, B and STEP actions; the communication pass
(:mod:`pipetrain.schedule.passes`) then inserts the sends and receives. :func:`build_schedule` runs
both and is what the simulator and the runtime consume. A generator sees all stages at once, as an
order may depend on its neighbours' partitions.

GPipe (Huang et al. 2019), fill-drain with a flush, ``m`` micro-batches on stage ``k``::

    F0 F1 ... F(m-1) B0 B1 ... B(m-1) STEP

Backward runs in forward sample order, as in the timing model of docs/algorithms.md §2.3, so every stage consumes
gradients in the order its successor produces them.

1F1B with a flush (PipeDream-Flush, Narayanan et al. 2021), ``K`` stages, stage ``k``: ``w =
min(K - k - 1, m)`` warm-up forwards, then alternate one forward and one backward, then drain::

    F0 .. F(w-1) | F(w) B0 F(w+1) B1 ... F(m-1) B(m-w-1) | B(m-w) .. B(m-1) STEP

At most ``w + 1`` micro-batches are in flight on stage ``k`` (GPipe: all ``m``). A replicated stage
(on ``r`` ranks, taking micro-batches round-robin) is ordered as one stage whose bound is ``r`` times
a replica's (:func:`replicated_in_flight`), and each replica runs its own micro-batches' sub-sequence.

**1F1B with unequal micro-batches** (pipetrain's extension; no engine has it): each stage has its
own partition, the same for forward and backward. Before its backward ``B_j`` (samples ``[lo,
hi)``), stage ``k`` issues forwards while either

* fewer than ``K - k`` of its micro-batches are in flight (the 1F1B memory bound), or
* it has forwarded fewer samples than ``B_j`` needs: its own ``hi``, and everything stage ``k + 1``
  forwards before the backward that returns sample ``hi - 1``'s gradient.

Orders are built from the last stage to the first, so the second rule reads stage ``k + 1``'s order.
Every dependency of a backward is then issued before it in program order on every stage, so the
schedule cannot deadlock (the validator's dry run checks it). With equal sizes the second rule
never binds and the orders are exactly the 1F1B orders above.

**1F1B over a DAG of stages** (GraphPipe, Jeon et al. 2025, method ``graph``): the same two rules,
with ``K - k`` replaced by the stages on ``k``'s longest path to the sink and the second rule read
over all of ``k``'s successors; stages are numbered in a topological order, so building from the
last stage to the first still sees every successor's order first. Two branches feeding one merge
stage thus warm up with 2 forwards each where a chain of the same stages would need 3 and 4.

**Local learning** (PPLL, Guo et al. 2024, docs/algorithms.md §6): every stage trains on its own
loss (an auxiliary head; the model's loss on the last stage) and steps its optimizer after every
micro-batch, so no gradient crosses a stage::

    F0 B0 STEP F1 B1 STEP ... F(m-1) B(m-1) STEP

The communication pass adds only RECV_F before and SEND_F after each F; the bounded queues between
stages are the plan's ``queue_depth`` (the validator's dry run and the simulator block a send while
its link holds that many unreceived messages; the runtime keeps that many receives posted and that
many sends outstanding per link).
**Asynchronous methods** (PipeDream, Narayanan et al. 2019; PipeDream-2BW, 2021; docs/algorithms.md §3.5):
one 1F1B order over the run's ``N·m`` micro-batches without a flush (the plan
:meth:`~pipetrain.plan.plan.Plan.repeated` ``N`` times), each F and B carrying its weight version
(:mod:`pipetrain.schedule.versions`). Stage ``k`` of 2 stages, ``m = 2``, ``N = 2``, ``pipedream``::

    stage 0:  F0v0 F1v0 B0v0 STEP F2v1 B1v0 STEP F3v2 B2v1 STEP B3v2 STEP
    stage 1:  F0v0 B0v0 STEP F1v1 B1v1 STEP F2v2 B2v2 STEP F3v3 B3v3 STEP

``pipedream`` steps after every backward (each micro-batch is a mini-batch) and an F runs on the
newest version (weight stashing: its B reuses it); with vertical sync every stage runs micro-batch
``j`` on the version stage 0 chose for it. A replicated stage (1F1B-RR) takes micro-batches
round-robin and each replica steps after each of its backwards, the replicas' ``i``-th STEPs summing
``r`` micro-batches' gradients. ``2bw`` steps after a batch's last backward, and micro-batch ``j``
(0-based) runs on version ``max(⌊j/m⌋ − 1, 0)`` on every stage (delay 1).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.interleaved import interleaved_programs
from pipetrain.schedule.interleaved_zb import interleaved_zb_programs
from pipetrain.schedule.passes import add_communication
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import local_queue, validate
from pipetrain.schedule.versions import check_chunks, validate_versions
from pipetrain.schedule.zbv import zbv_programs
from pipetrain.schedule.zero_bubble import (
    ZbKind,
    strict_memory_sequences,
    zb1_sequences,
    zb2_in_flight,
    zb2_sequences,
)

__all__ = [
    "DEFAULT_ASYNC_BATCHES",
    "GENERATORS",
    "async_programs",
    "build_schedule",
    "compute_schedule",
    "gpipe_orders",
    "graph_orders",
    "local_orders",
    "one_f_one_b_orders",
    "one_f_one_b_sequences",
    "zb1_orders",
    "zb2_orders",
]

# The plan's stages -> each stage's compute actions (F, B, STEP), in stage order.
Generator = Callable[[Sequence[StagePlan]], list[list[Action]]]


def _forwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    return [Action(ActionKind.F, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def _backwards(stage: int, sizes: tuple[int, ...]) -> list[Action]:
    return [Action(ActionKind.B, stage, j, lo, hi) for j, (lo, hi) in enumerate(ranges(sizes))]


def gpipe_orders(stages: Sequence[StagePlan]) -> list[list[Action]]:
    """All forwards, then all backwards, then the step (fill-drain). Also UMPIPE's order."""
    return [
        [*_forwards(k, s.forward_sizes), *_backwards(k, s.backward_sizes), Action(ActionKind.STEP, k)]
        for k, s in enumerate(stages)
    ]


def one_f_one_b_sequences(
    partitions: Sequence[Sequence[int]], in_flight: Sequence[int] | None = None,
    successors: Sequence[Sequence[int]] | None = None,
) -> list[list[tuple[bool, int]]]:
    """Per stage, the 1F1B order as ``(is_backward, micro-batch index)`` pairs, without the step.

    Args:
        partitions: per stage, its micro-batch sizes (forward = backward), each summing to ``B``.
        in_flight: per stage, the micro-batches it may hold before its next backward; default
            ``K - k`` (the 1F1B bound).
        successors: per stage, the stages it feeds (a DAG whose edges go to higher stages, method
            ``graph``); default the chain ``k -> k + 1``. A stage's second rule then reads all of
            its successors' orders.
    """
    n = len(partitions)
    bound = list(in_flight) if in_flight is not None else [n - k for k in range(n)]
    succ = successors if successors is not None else [[k + 1] if k + 1 < n else [] for k in range(n)]
    orders: list[list[tuple[bool, int]]] = [[] for _ in partitions]
    ends_of: dict[int, list[int]] = {}  # stage: its backward ends ...
    before_of: dict[int, list[int]] = {}  # ... and the samples it forwards before each of those backwards
    for k in range(n - 1, -1, -1):
        ends = list(accumulate(partitions[k]))
        order, before, i = orders[k], [], 0
        for j, hi in enumerate(ends):
            need = max([hi, *(before_of[t][bisect_left(ends_of[t], hi)] for t in succ[k])])
            while i < len(ends) and (i - j < bound[k] or (ends[i - 1] if i else 0) < need):
                order.append((False, i))
                i += 1
            before.append(ends[i - 1])
            order.append((True, j))
        ends_of[k], before_of[k] = ends, before
    return orders


def one_f_one_b_orders(stages: Sequence[StagePlan]) -> list[list[Action]]:
    """1F1B orders, for equal or per-stage unequal partitions (see the module docstring).

    Raises:
        UserError: a stage whose forward and backward sizes differ.
    """
    return _ordered(stages, one_f_one_b_sequences([s.forward_sizes for s in stages], replicated_in_flight(stages)))


def local_orders(stages: Sequence[StagePlan]) -> list[list[Action]]:
    """Per micro-batch ``F j, B j, STEP`` on every stage (local learning, see the module docstring).

    Raises:
        UserError: a stage whose forward and backward sizes differ.
    """
    orders = []
    for k, s in enumerate(stages):
        if s.forward_sizes != s.backward_sizes:
            raise UserError(f"stage {k}: method local updates per micro-batch and needs equal forward and backward "
                            "micro-batch sizes; give the stage one partition")
        fwd, bwd = _forwards(k, s.forward_sizes), _backwards(k, s.backward_sizes)
        orders.append([a for f, b in zip(fwd, bwd, strict=True) for a in (f, b, Action(ActionKind.STEP, k))])
    return orders


def replicated_in_flight(stages: Sequence[StagePlan], successors: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Per stage, the 1F1B in-flight bound counted over all its replicas.

    Each replica of stage ``k`` (on ``r_k`` ranks, with ``R_k`` ranks on the longest path from ``k``
    to the last stage, ``k`` included) keeps ``(R_k - 1) // r_k + 1`` micro-batches in flight,
    PipeDream's warm-up rule (docs/algorithms.md §3.4): enough to keep the downstream ranks busy;
    ``K - k`` on a chain without replicas, and on a DAG of stages (GraphPipe §3.4) the number of
    stages on ``k``'s longest path to the sink.
    """
    n = len(stages)
    succ = successors if successors is not None else [[k + 1] if k + 1 < n else [] for k in range(n)]
    path = [0] * n  # ranks on the longest path from k to the sink
    for k in range(n - 1, -1, -1):
        path[k] = len(stages[k].ranks) + max((path[t] for t in succ[k]), default=0)
    return [len(s.ranks) * ((path[k] - 1) // len(s.ranks) + 1) for k, s in enumerate(stages)]


def graph_orders(stages: Sequence[StagePlan], edges: Sequence[tuple[int, int]]) -> list[list[Action]]:
    """1F1B over a DAG of stages (method ``graph``, GraphPipe §3.4): a stage keeps as many
    micro-batches in flight as there are stages on its longest path to the sink, and issues forwards
    early enough for every successor (the second rule of the module docstring, over all successors).

    Raises:
        UserError: a stage whose forward and backward sizes differ.
    """
    successors = [sorted(b for a, b in edges if a == k) for k in range(len(stages))]
    return _ordered(stages, one_f_one_b_sequences([s.forward_sizes for s in stages],
                                                  replicated_in_flight(stages, successors), successors))


def _ordered(stages: Sequence[StagePlan], sequences: Sequence[Sequence[tuple[bool, int]]]) -> list[list[Action]]:
    """Each stage's ``(is_backward, j)`` sequence as actions, then its STEP (equal forward and backward sizes)."""
    for k, s in enumerate(stages):
        if s.forward_sizes != s.backward_sizes:
            raise UserError(f"stage {k}: 1F1B needs equal forward and backward micro-batch sizes; "
                            "use method 'uedp' for different ones")
    orders = []
    for k, (s, sequence) in enumerate(zip(stages, sequences, strict=True)):
        fwd, bwd = _forwards(k, s.forward_sizes), _backwards(k, s.backward_sizes)
        orders.append([*(bwd[j] if backward else fwd[j] for backward, j in sequence), Action(ActionKind.STEP, k)])
    return orders


def zb1_orders(stages: Sequence[StagePlan], strict_memory: bool = False) -> list[list[Action]]:
    """ZB-H1 orders (Qi et al. 2024 §2.1, :mod:`pipetrain.schedule.zero_bubble`): each stage's 1F1B
    order (equal or per-stage unequal partitions) with its backward split into B and W, at most
    ``k`` W actions deferred on stage ``k``; ``strict_memory``: the variant that holds no more than
    1F1B on every stage (:func:`~pipetrain.schedule.zero_bubble.strict_memory_sequences`).

    Raises:
        UserError: a stage whose forward and backward sizes differ, or a replicated stage.
    """
    sequences = one_f_one_b_sequences([s.forward_sizes for s in stages])
    return _split_orders(stages, sequences, strict_memory_sequences if strict_memory else zb1_sequences)


def zb2_orders(stages: Sequence[StagePlan]) -> list[list[Action]]:
    """ZB-H2 orders (Qi et al. 2024 §2.2, :mod:`pipetrain.schedule.zero_bubble`): 1F1B with ``2 (K − k) − 1``
    warm-up forwards on stage ``k``, the backward split into B and W, at most ``2K − 1`` micro-batches
    held from F to W.

    Raises:
        UserError: a stage whose forward and backward sizes differ, or a replicated stage.
    """
    sequences = one_f_one_b_sequences([s.forward_sizes for s in stages], zb2_in_flight(len(stages)))
    return _split_orders(stages, sequences, zb2_sequences)


def _split_orders(stages: Sequence[StagePlan], sequences: Sequence[Sequence[tuple[bool, int]]],
                  place: Callable[[Sequence[Sequence[tuple[bool, int]]]], list[list[tuple[ZbKind, int]]]],
                  ) -> list[list[Action]]:
    """The stages' F/B ``sequences`` with W placed by ``place``, as actions, each program ending in its STEP."""
    if any(len(s.ranks) > 1 for s in stages):
        raise UserError("the zero-bubble methods cannot run replicated stages yet; give every stage one rank "
                        "or use method 1f1b")
    _ordered(stages, sequences)  # checks forward = backward sizes
    orders = []
    for k, (stage, sequence) in enumerate(zip(stages, place(sequences), strict=True)):
        spans = ranges(stage.forward_sizes)
        actions = [Action(ActionKind(kind), k, j, *spans[j]) for kind, j in sequence]
        orders.append([*actions, Action(ActionKind.STEP, k)])
    return orders


GENERATORS: dict[Method, Generator] = {
    Method.GPIPE: gpipe_orders,
    Method.ONE_F_ONE_B: one_f_one_b_orders,
    Method.ZB1: zb1_orders,
    Method.ZB2: zb2_orders,
    Method.UEDP: gpipe_orders,
    Method.LOCAL: local_orders,
}

MULTI_STAGE: dict[Method, Callable[[Plan], dict[int, list[Action]]]] = {
    Method.INTERLEAVED: interleaved_programs,  # Narayanan et al. 2021 §2.2
    Method.INTERLEAVED_ZB: interleaved_zb_programs,  # the same with zb1's split backward
    Method.ZBV: zbv_programs,  # Qi et al. 2024 §6, V placement
}
"""The multi-stage methods' generators (looping or V placement): the plan -> every rank's compute
actions (all of its stages')."""


DEFAULT_ASYNC_BATCHES = 4
"""Batches an asynchronous schedule spans when no run length is given (plan, simulate, Gantt)."""


def async_programs(plan: Plan, batches: int) -> dict[int, list[Action]]:
    """Every rank's compute actions (F, B, STEP, with versions) for ``batches`` batches of an
    asynchronous plan, in the run-long batch's sample ranges (module docstring)."""
    run = plan.repeated(batches)
    sequences = one_f_one_b_sequences([s.forward_sizes for s in run.stages], replicated_in_flight(run.stages))
    spans = ranges(run.stages[0].forward_sizes)
    stage0_versions: list[int] = []  # vertical sync: the version stage 0 ran micro-batch j on
    programs = {}
    for k, (stage, sequence) in enumerate(zip(run.stages, sequences, strict=True)):
        for rank in stage.ranks:
            programs[rank] = _async_rank(plan, k, rank, sequence, spans, stage0_versions)
    return programs


def _async_rank(plan: Plan, k: int, rank: int, sequence: Sequence[tuple[bool, int]],
                spans: Sequence[tuple[int, int]], stage0_versions: list[int]) -> list[Action]:
    """One rank's sub-sequence of its stage's order, with versions and STEPs."""
    m = len(plan.stages[0].forward_sizes)
    out: list[Action] = []
    steps, version = 0, {}
    for backward, j in sequence:
        if plan.replica_rank(k, j) != rank:
            continue
        lo, hi = spans[j]
        if not backward:
            if plan.weights is WeightPolicy.TWO_BW:
                version[j] = max(j // m - 1, 0)
            elif plan.weights is WeightPolicy.VERTICAL_SYNC and k > 0:
                version[j] = stage0_versions[j]
            else:
                version[j] = steps
                if k == 0:
                    stage0_versions.append(steps)
            out.append(Action(ActionKind.F, k, j, lo, hi, version=version[j]))
            continue
        out.append(Action(ActionKind.B, k, j, lo, hi, version=version.pop(j)))
        if plan.weights is not WeightPolicy.TWO_BW or j % m == m - 1:
            out.append(Action(ActionKind.STEP, k))
            steps += 1
    return out


def compute_schedule(plan: Plan) -> Schedule:
    """Every rank's compute actions (F, B, STEP) for the plan's method, before communication.

    A replicated stage's order is computed as if it ran on one rank; each replica then runs the
    sub-sequence of the micro-batches it owns (:meth:`~pipetrain.plan.plan.Plan.replica_rank`) and the
    STEP. Dropping actions from a deadlock-free program only removes ordering constraints, so the
    replicated schedule cannot deadlock either (the validator's dry run checks it).
    """
    if plan.method in MULTI_STAGE:
        return Schedule.from_mapping(MULTI_STAGE[plan.method](plan))
    if plan.method is Method.GRAPH:
        orders = graph_orders(plan.stages, plan.stage_edges)
    elif plan.method in GENERATORS:
        orders = GENERATORS[plan.method](plan.stages)
    else:
        known = ", ".join(m.value for m in (*GENERATORS, Method.GRAPH, *MULTI_STAGE))
        raise UserError(f"method {plan.method.value!r} has no schedule generator yet; use one of: {known}")
    programs: dict[int, list[Action]] = {}
    for k, (stage, actions) in enumerate(zip(plan.stages, orders, strict=True)):
        for rank in stage.ranks:
            programs[rank] = [a for a in actions
                              if a.kind is ActionKind.STEP or plan.replica_rank(k, a.microbatch) == rank]
    return Schedule.from_mapping(programs)


def _stages_of_ranks(plan: Plan) -> list[tuple[int, ...]]:
    return [plan.stages_of_rank(r) for r in range(plan.n_ranks)]


def build_schedule(plan: Plan, batches: int | None = None) -> Schedule:
    """The complete, validated, runnable schedule: compute order plus sends and receives.

    An asynchronous plan's schedule spans ``batches`` batches (default :data:`DEFAULT_ASYNC_BATCHES`)
    and has its versions and per-batch chunks checked (:mod:`pipetrain.schedule.versions`); a
    synchronous plan's is one batch, whatever ``batches`` says.
    """
    plan.validate()
    if plan.asynchronous:
        n = DEFAULT_ASYNC_BATCHES if batches is None else batches
        run = plan.repeated(n)
        schedule = add_communication(Schedule.from_mapping(async_programs(plan, n)), run)
        validate(schedule, run.batch_size, run.rank_stages, run.n_stages, steps_anywhere=True)
        validate_versions(schedule, plan)
        check_chunks(schedule, plan, n)
        return schedule
    schedule = add_communication(compute_schedule(plan), plan)
    validate(schedule, plan.batch_size, plan.rank_stages, plan.n_stages, local_queue=local_queue(plan),
             stage_edges=plan.stage_edges, stages_of_rank=_stages_of_ranks(plan))
    return schedule
