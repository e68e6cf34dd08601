"""1F1B with a flush, on a chain or a DAG of stages (methods ``1f1b`` and ``graph``).

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
stage thus warm up with 2 forwards each where a chain of the same stages would need 3 and 4. A chain
is the DAG ``k -> k + 1``, so one generator serves both methods.

Data: a partition is a stage's micro-batch sizes, summing to the batch ``B``; a sequence is a stage's
order as ``(is_backward, j)`` pairs (:mod:`pipetrain.schedule.orders`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.schedule.orders import Orders, sequenced

__all__ = ["one_f_one_b_orders", "one_f_one_b_sequences", "replicated_in_flight"]


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


def one_f_one_b_orders(plan: Plan) -> Orders:
    """Per stage, its 1F1B order over the plan's stage graph (the chain, or method ``graph``'s DAG),
    equal or per-stage unequal partitions, then its STEP (module docstring).

    Raises:
        UserError: a stage whose forward and backward sizes differ.
    """
    successors = [plan.stage_successors(k) for k in range(plan.n_stages)]
    sequences = one_f_one_b_sequences([s.forward_sizes for s in plan.stages],
                                      replicated_in_flight(plan.stages, successors), successors)
    return sequenced(plan.stages, sequences)
