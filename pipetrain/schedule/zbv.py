"""ZB-V: Zero Bubble's V-shape schedule, two chunks per rank, split backward (method ``zbv``).

Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §6 ("ZB-V"), and §2 for the
split backward: ``B`` computes a stage's input gradient (what the previous stage waits for), ``W``
its weight gradient (what only the optimizer step waits for).

**The paper's.** The model is cut into ``2R`` stages (chunks) of about equal cost; rank ``r`` of
``R`` holds chunk 0, stage ``r``, and chunk 1, stage ``2R − 1 − r`` (:mod:`pipetrain.plan.placement`),
so a micro-batch's forward goes down the ranks and back up, its backward the same way in reverse,
and rank 0 runs both the first stage and the last (the loss). Because rank ``R − 1`` hands chunk 0's
output straight to its own chunk 1, and rank 0 turns a forward into a backward with no message, the
fill and the drain take about half as long as interleaved's. Each rank warms up with forwards of
chunk 0, then of chunk 1, then alternates F and B across its two chunks while W fills the gaps; the
peak of held activations is 1F1B's, ``R`` micro-batches of a whole rank's layers, i.e. ``2R``
(chunk, micro-batch) pairs of half a rank's layers each. With ``T_F = T_B = T_W`` the paper reports
its bubble near zero.

**Our reconstruction.** The paper gives the V placement, the warm-up/steady/cool-down shape and the
memory bound (its figure shows one instance); pipetrain builds the per-rank orders with its own
greedy list scheduler, in simulated time (unit times by default; per-stage F, B, W seconds can be
given): whenever a rank is free it runs, in this priority,

1. a ready ``B`` (lowest micro-batch first): the critical path;
2. a ready ``F`` (chunk 1 before chunk 0, lowest micro-batch first) when memory allows: a chunk-0
   ``F`` *reserves* the slot its micro-batch's chunk-1 ``F`` will take, and runs only while
   ``held + reserved + 2 <= H``; a chunk-1 ``F`` uses its reserved slot, so it is never refused;
3. the oldest pending ``W`` (the deferred weight gradients fill what would be bubbles);

and otherwise waits for the next arrival. ``held`` counts the rank's (chunk, micro-batch) pairs
from ``F`` to ``W`` and ``H = 2R`` (1F1B's peak). Since every chunk-1 forward can always run and a
micro-batch's backward needs no memory, every micro-batch in flight completes, so the orders cannot
deadlock (the validator's dry run checks it). Both chunks take micro-batches in increasing order,
so the messages on each link keep their order. Any ``m >= 1`` works; micro-batches are equal.

**Robust to timing (ours).** The runtime runs a static order, and an order built in exact unit time
leans on ties (a B and an F ready at the same instant) that real times break: on gpt1-14 at V100
scale, where B is about 1.6× F and messages take time, the unit-time order left a 23 % bubble at
``R = 4, m = 32``. So :func:`robust_orders` builds candidates with several ``(F, B, W)`` times
(:data:`TIE_BREAKS`: unit, tie-breaking perturbations of it, B 1.2× and 1.5× F), replays each in
every :data:`SCENARIOS` (unit; B 1.5×; W 0.5×; message latencies) with :func:`replay_makespan`,
and keeps the one whose worst ratio to the best candidate is least. A plan carries no stage times,
so the choice depends only on ``(R, m)`` and the runtime rebuilds the same order. At unit costs
this gives up a little of the unit-time optimum (tests/unit/test_zbv.py): no order of ``6m`` unit
actions per rank ends before ``6m + R − 1`` (rank ``r`` starts at ``r``), and the chosen ones end
by ``6m + 2R − 2`` for ``R <= 4`` (``6m + 16`` for ``R = 8``), a bubble that shrinks as ``1/m``
against 1F1B's ``(R − 1)/(m + R − 1)``. ``R = 2``, ``m = 4`` (rank 0 holds stages 0 and 3, rank 1
stages 1 and 2)::

    rank 0:  0F0 0F1 3F0 3B0 3F1 3B1 3W0 0B0 3W1 0B1 0F2 0W0 0W1 0F3 3F2 3B2 3W2 3F3 3B3 0B2 3W3 0W2 0B3 0W3
             0STEP 3STEP
    rank 1:  1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1 2W0 1W0 2W1 1F2 2F2 1W1 1F3 2F3 2B2 1B2 2W2 2B3 1B3 1W2 2W3 1W3
             1STEP 2STEP

Rank 0 holds at most ``H = 4`` pairs (after ``3F1`` it runs W to free slots before ``0F2``).

Data: per rank, ``(kind, stage, micro-batch)`` triples; kinds ``"F"``, ``"B"``, ``"W"``.
"""

from __future__ import annotations

import functools
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.zero_bubble import ZbKind

__all__ = ["SCENARIOS", "TIE_BREAKS", "StageTimes", "replay_makespan", "robust_orders", "zbv_bound", "zbv_orders",
           "zbv_programs"]

Step = tuple[ZbKind, int, int]  # (kind, stage, micro-batch)
StageTimes = tuple[float, float, float]  # one stage's (F, B, W) seconds per micro-batch
Scenario = tuple[float, float, float, float]  # (F, B, W, message latency) of every chunk
_UNIT: StageTimes = (1.0, 1.0, 1.0)


def zbv_bound(n_ranks: int) -> int:
    """``H = 2R``: the (chunk, micro-batch) pairs a rank may hold from F to W, 1F1B's peak
    (``R`` micro-batches of a whole rank's layers) counted in half-rank chunks."""
    return 2 * n_ranks


@dataclass
class _Rank:
    """One rank's state in the list scheduler."""

    stages: tuple[int, int]  # (chunk 0's stage, chunk 1's stage)
    free_s: float = 0.0
    next_f: list[int] = field(default_factory=lambda: [0, 0])  # next micro-batch to forward, per chunk
    next_b: list[int] = field(default_factory=lambda: [0, 0])
    pending_w: deque[tuple[int, int]] = field(default_factory=deque)  # (stage, micro-batch) waiting for W
    held: int = 0
    reserved: int = 0
    order: list[Step] = field(default_factory=list)


class _ListScheduler:
    """The greedy list scheduler of the module docstring over ``2R`` stages and ``m`` micro-batches."""

    def __init__(self, n_ranks: int, n_micro: int, times: Sequence[StageTimes], bound: int) -> None:
        self.n, self.m, self.times, self.bound = n_ranks, n_micro, times, bound
        self.ranks = [_Rank((r, 2 * n_ranks - 1 - r)) for r in range(n_ranks)]
        self.f_done: dict[tuple[int, int], float] = {}  # (stage, micro-batch) -> end of its F
        self.b_done: dict[tuple[int, int], float] = {}

    def _ready_f(self, rank: _Rank, chunk: int, now: float) -> bool:
        stage, j = rank.stages[chunk], rank.next_f[chunk]
        if j >= self.m:
            return False
        if stage > 0 and self.f_done.get((stage - 1, j), float("inf")) > now:
            return False
        if chunk == 1:  # uses the slot its chunk-0 forward reserved
            return True
        return rank.held + rank.reserved + 2 <= self.bound

    def _ready_b(self, rank: _Rank, chunk: int, now: float) -> bool:
        stage, j = rank.stages[chunk], rank.next_b[chunk]
        if j >= self.m or self.f_done.get((stage, j), float("inf")) > now:
            return False
        last = stage == 2 * self.n - 1
        return last or self.b_done.get((stage + 1, j), float("inf")) <= now

    def _pick(self, rank: _Rank, now: float) -> Step | None:
        """The action ``rank`` starts at ``now`` (module docstring's priority), or None to wait."""
        ready_b = [c for c in (0, 1) if self._ready_b(rank, c, now)]
        if ready_b:
            c = min(ready_b, key=lambda c: (rank.next_b[c], -c))
            return "B", rank.stages[c], rank.next_b[c]
        for c in (1, 0):
            if self._ready_f(rank, c, now):
                return "F", rank.stages[c], rank.next_f[c]
        if rank.pending_w:
            stage, j = rank.pending_w[0]
            return "W", stage, j
        return None

    def _run(self, rank: _Rank, step: Step, now: float) -> None:
        kind, stage, j = step
        chunk = rank.stages.index(stage)
        f_s, b_s, w_s = self.times[stage]
        if kind == "F":
            rank.next_f[chunk] += 1
            rank.held += 1
            rank.reserved += 1 if chunk == 0 else -1
            end = self.f_done[(stage, j)] = now + f_s
        elif kind == "B":
            rank.next_b[chunk] += 1
            rank.pending_w.append((stage, j))
            end = self.b_done[(stage, j)] = now + b_s
        else:
            rank.pending_w.popleft()
            rank.held -= 1
            end = now + w_s
        rank.order.append(step)
        rank.free_s = end

    def run(self) -> list[list[Step]]:
        """Every rank's order (simulated until every action ran)."""
        total = 3 * 2 * self.m
        events = [0.0]
        while events:
            now = heapq.heappop(events)
            while events and events[0] <= now:
                heapq.heappop(events)
            for rank in self.ranks:
                if rank.free_s > now:
                    continue
                step = self._pick(rank, now)
                if step is not None:
                    self._run(rank, step, now)
                    heapq.heappush(events, rank.free_s)
        orders = [rank.order for rank in self.ranks]
        stuck = [r for r, order in enumerate(orders) if len(order) != total]
        if stuck:  # cannot happen with bound >= 2 (module docstring); a guard for a bad bound
            raise ValueError(f"zbv list scheduler stalled on ranks {stuck} with bound {self.bound}; use a bound >= 2")
        return orders


def zbv_orders(n_ranks: int, n_micro: int, times: Sequence[StageTimes] | None = None,
               bound: int | None = None) -> list[list[Step]]:
    """Per rank, its ZB-V order of ``(kind, stage, micro-batch)`` (module docstring).

    Args:
        n_ranks: ``R``; the model has ``2R`` stages, stage ``s`` on rank :func:`~pipetrain.plan.
            placement.v_rank` ``(s, R)``.
        n_micro: ``m >= 1`` equal micro-batches.
        times: per stage ``[2R]``, its ``(F, B, W)`` seconds per micro-batch; default unit times.
        bound: the most (chunk, micro-batch) pairs a rank holds from F to W; default :func:`zbv_bound`.

    Raises:
        ValueError: ``R < 1``, ``m < 1``, ``times`` not of length ``2R``, or ``bound < 2``.
    """
    if n_ranks < 1 or n_micro < 1:
        raise ValueError(f"zbv needs R >= 1 ranks and m >= 1 micro-batches, got R = {n_ranks}, m = {n_micro}")
    stage_times = list(times) if times is not None else [_UNIT] * (2 * n_ranks)
    if len(stage_times) != 2 * n_ranks:
        raise ValueError(f"zbv: give (F, B, W) times for each of the {2 * n_ranks} stages, got {len(stage_times)}")
    cap = zbv_bound(n_ranks) if bound is None else bound
    if cap < 2:
        raise ValueError(f"zbv: a rank must hold at least 2 pairs (one per chunk), got bound {cap}")
    return _ListScheduler(n_ranks, n_micro, stage_times, cap).run()


TIE_BREAKS: tuple[StageTimes, ...] = ((1.0, 1.0, 1.0), (0.99, 1.0, 1.0), (1.0, 1.01, 1.0), (1.0, 1.0, 0.99),
                                      (1.0, 1.01, 0.99), (1.0, 1.2, 1.0), (1.0, 1.5, 1.0))
"""The ``(F, B, W)`` times :func:`robust_orders` builds candidate orders with: unit times and small
perturbations of them (which only break unit time's ties another way), and B 1.2 and 1.5 times F."""

SCENARIOS: tuple[Scenario, ...] = (
    (1.0, 1.0, 1.0, 0.0), (1.0, 1.5, 1.0, 0.0), (1.0, 1.0, 1.0, 0.2), (1.0, 1.5, 1.0, 0.2), (1.0, 1.0, 0.5, 0.1))
"""The ``(F, B, W, message latency)`` times, per chunk, :func:`robust_orders` replays each candidate in."""


def replay_makespan(orders: Sequence[Sequence[Step]], n_ranks: int, scenario: Scenario) -> float:
    """When the last rank ends if each rank runs its order as soon as its inputs arrive: every F, B
    and W of every stage takes ``scenario[:3]``, a message between two ranks ``scenario[3]``; ``inf``
    if the orders deadlock."""
    f_s, b_s, w_s, latency = scenario
    seconds = {"F": f_s, "B": b_s, "W": w_s}
    last = 2 * n_ranks - 1
    clock, pos, done = [0.0] * n_ranks, [0] * n_ranks, dict[tuple[str, int, int], float]()
    progress = True
    while progress:
        progress = False
        for rank, order in enumerate(orders):
            while pos[rank] < len(order):
                kind, stage, j = order[pos[rank]]
                needs = ([("F", stage - 1, j)] if stage > 0 else []) if kind == "F" else \
                    [("F", stage, j), *([("B", stage + 1, j)] if stage < last else [])] if kind == "B" else \
                    [("B", stage, j)]
                if any(n not in done for n in needs):
                    break
                ready = [done[n] + (latency if v_rank(n[1], n_ranks) != rank else 0.0) for n in needs]
                clock[rank] = done[(kind, stage, j)] = max([clock[rank], *ready]) + seconds[kind]
                pos[rank] += 1
                progress = True
    finished = all(p == len(order) for p, order in zip(pos, orders, strict=True))
    return max(clock) if finished else float("inf")


@functools.lru_cache(maxsize=256)
def robust_orders(n_ranks: int, n_micro: int) -> tuple[tuple[Step, ...], ...]:
    """The ZB-V orders a plan runs: of the candidates built with each of :data:`TIE_BREAKS`, the one
    whose worst ratio to the best candidate over :data:`SCENARIOS` is least (module docstring)."""
    candidates = [zbv_orders(n_ranks, n_micro, [times] * (2 * n_ranks)) for times in TIE_BREAKS]
    spans = [[replay_makespan(c, n_ranks, scenario) for scenario in SCENARIOS] for c in candidates]
    floors = [min(column) for column in zip(*spans, strict=True)]
    worst = [max(span / floor for span, floor in zip(row, floors, strict=True)) for row in spans]
    best = candidates[worst.index(min(worst))]
    return tuple(tuple(order) for order in best)


def zbv_programs(plan: Plan) -> Orders:
    """Per rank, its compute actions for a plan of method ``zbv``: F, B, W in the order of
    :func:`robust_orders`, then one STEP per stage (chunk 0's, then chunk 1's)."""
    n_ranks = plan.n_ranks
    spans = ranges(plan.stages[0].forward_sizes)
    programs: Orders = []
    for rank, order in enumerate(robust_orders(n_ranks, len(spans))):
        out = [Action(ActionKind(kind), stage, j, *spans[j]) for kind, stage, j in order]
        programs.append([*out, *(Action(ActionKind.STEP, stage) for stage in (rank, 2 * n_ranks - 1 - rank))])
    return programs
