"""DualPipeV: DeepSeek's bidirectional schedule cut in half onto a V, two chunks per rank (method ``dualpipev``).

DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1 ("DualPipe"), and the "cut-in-half"
DualPipeV variant of its public DualPipe description; torch.distributed.pipelining 2.13 ships it as
``ScheduleDualPipeV``. DualPipe feeds micro-batches from both ends of the pipeline at once; DualPipeV
folds that onto the V placement of ZB-V (:mod:`pipetrain.schedule.zbv`, Qi et al. 2024 §6): rank
``r`` of ``R`` holds the *down* chunk, stage ``r``, and the *up* chunk, stage ``2R − 1 − r``, so every
rank meets each micro-batch twice and its forward of one chunk can be paired with a backward of the
other. The pairing is what DeepSeek overlaps with the all-to-all of expert parallelism; on one
compute stream the pair runs as the forward, then the backward. The backward is split into ``B``
(input gradient) and ``W`` (weight gradient) only where that fills a bubble (the warm-up's first
backwards and the second half of the drain); elsewhere a backward is *full*: ``B`` immediately
followed by its ``W``, which computes what a fused backward does.

**The order** of rank ``r`` (``N ≥ 2R`` micro-batches, each chunk's forwards and backwards in
increasing micro-batch order; ``W()`` runs the oldest deferred weight gradient, if any)::

    1. 2(R − r − 1) ×  F down                          fill the down leg
    2. (r + 1)      ×  F down, F up                    reach the V's turn
    3. (R − r − 1)  ×  B up (split), W(), F up         first backwards, zero-bubble style
    4. N − 2R + r + 1 × F down + B up, F up + B down   the steady state: a forward of one chunk paired
                                                       with a full backward of the other
    5. (R − r − 1)  ×  B up, F up + B down             the last up forwards
    6. (r + 1)      ×  B up, B down                    drain; from the middle pair on, split (odd
                                                       ranks before B up, even ranks before B down)
    7. (R − r − 1)  ×  W(), B down (split)
    8. (r + 1)      ×  W()                             the deferred weight gradients

Each chunk runs ``N`` forwards and ``N`` backwards. ``R = 2``, ``N = 4`` (rank 0 holds stages 0
and 3, rank 1 stages 1 and 2)::

    rank 0:  0F0 0F1 0F2 3F0 3B0 3W0 3F1 0F3 3B1 3W1 3F2 0B0 0W0 3B2 3W2 3F3 0B1 0W1 3B3 3W3 0B2 0W2 0B3
             0W3 0STEP 3STEP
    rank 1:  1F0 2F0 1F1 2F1 1F2 2B0 2W0 2F2 1B0 1W0 1F3 2B1 2W1 2F3 1B1 1W1 2B2 2W2 1B2 1W2 2B3 1B3 2W3
             1W3 1STEP 2STEP

Data: per rank, ``(kind, stage, micro-batch)`` triples; kinds ``"F"``, ``"B"``, ``"W"``.
"""

from __future__ import annotations

from collections import Counter, deque

from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.zero_bubble import ZbKind

__all__ = ["dualpipev_order", "dualpipev_programs"]

Step = tuple[ZbKind, int, int]  # (kind, stage, micro-batch)


class _Order:
    """One rank's order under construction: each chunk's next forward and backward, deferred Ws."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.next: Counter[tuple[str, int]] = Counter()
        self.deferred: deque[tuple[int, int]] = deque()

    def forward(self, stage: int) -> None:
        self.steps.append(("F", stage, self.next["F", stage]))
        self.next["F", stage] += 1

    def backward(self, stage: int, split: bool = False) -> None:
        """``B``, then its ``W`` at once (a full backward) or later (``split``, :meth:`weight`)."""
        j = self.next["B", stage]
        self.next["B", stage] += 1
        self.steps.append(("B", stage, j))
        if split:
            self.deferred.append((stage, j))
        else:
            self.steps.append(("W", stage, j))

    def weight(self) -> None:
        """The oldest deferred ``W``, if any."""
        if self.deferred:
            stage, j = self.deferred.popleft()
            self.steps.append(("W", stage, j))


def dualpipev_order(rank: int, n_ranks: int, n_micro: int) -> list[Step]:
    """Rank ``rank``'s order of F, B and W over its two chunks (module docstring, steps 1–8).

    Raises:
        ValueError: fewer micro-batches than stages (``n_micro < 2 · n_ranks``).
    """
    if n_micro < 2 * n_ranks:
        raise ValueError(f"DualPipeV needs at least as many micro-batches as stages ({2 * n_ranks}), got {n_micro}")
    down, up, rest = rank, 2 * n_ranks - 1 - rank, n_ranks - rank - 1
    order = _Order()
    for _ in range(2 * rest):
        order.forward(down)
    for _ in range(rank + 1):
        order.forward(down)
        order.forward(up)
    for _ in range(rest):
        order.backward(up, split=True)
        order.weight()
        order.forward(up)
    for _ in range(n_micro - 2 * n_ranks + rank + 1):
        order.forward(down)
        order.backward(up)
        order.forward(up)
        order.backward(down)
    for _ in range(rest):
        order.backward(up)
        order.forward(up)
        order.backward(down)
    _drain(order, rank, rest, down, up)
    return order.steps


def _drain(order: _Order, rank: int, rest: int, down: int, up: int) -> None:
    """Steps 6–8: both chunks' last backwards, split from the middle pair on, then the deferred Ws."""
    split = False
    for i in range(rank + 1):
        middle = i == (rank + 1) // 2
        split = split or (middle and rank % 2 == 1)
        order.backward(up, split)
        split = split or middle
        order.backward(down, split)
    for _ in range(rest):
        order.weight()
        order.backward(down, split=True)
    for _ in range(rank + 1):
        order.weight()


def dualpipev_programs(plan: Plan) -> Orders:
    """Per rank, its compute actions for a plan of method ``dualpipev``: F, B, W in :func:`dualpipev_order`,
    then one STEP per stage (the down chunk's, then the up chunk's)."""
    n_ranks = plan.n_ranks
    spans = ranges(plan.stages[0].forward_sizes)
    programs: Orders = []
    for rank in range(n_ranks):
        out = [Action(ActionKind(kind), stage, j, *spans[j]) for kind, stage, j in
               dualpipev_order(rank, n_ranks, len(spans))]
        programs.append([*out, *(Action(ActionKind.STEP, stage) for stage in (rank, 2 * n_ranks - 1 - rank))])
    return programs
