"""Stage cuts searched together with unequal micro-batches (pipetrain's extension of UMPIPE).

    plan = search_cuts(start, run, screen, rounds=3, others=[counts, ...])

UMPIPE's planners (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025) size each stage's micro-batches on fixed
stages, and pipetrain takes them from the best equal plan (:mod:`pipetrain.planners.unequal`). Those
cuts balance the layers' cost at one micro-batch size; once each stage runs its own count they need
not be the best: a stage with a large fixed cost per micro-batch (the loss, host dispatch, weight
reads) runs fewer, larger micro-batches, gets cheaper per sample, and can take more layers.

The search, over cuts written as layer counts per stage (``(2, 4, 4, 4)``: 14 layers on 4 stages):

1. *screen* the start's cuts and ``others`` (e.g. the balanced planner's cuts at other micro-batch
   counts): plan each with ``screen``, a short run of the micro-batch planner;
2. hill-climb from the fastest: each round screens every move of one boundary by one layer
   (at most ``2 (K − 1)`` neighbours) and moves to the fastest if it beats the current cuts; stop
   after ``rounds`` rounds or at a local optimum;
3. plan the start's cuts and, when it differs, the winner's with ``run``, the full planner, and
   return the faster of the two: never slower than planning the start's cuts alone.

Cost: the screens (``len(others) + 1 + rounds · 2 (K − 1)`` short runs) plus one or two full runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from pipetrain.plan.plan import Plan

__all__ = ["Counts", "cut_moves", "equal_cuts", "layer_counts", "search_cuts", "with_counts"]

log = logging.getLogger(__name__)

Counts = tuple[int, ...]
"""Layers per stage, in stage order; they sum to the model's layers."""
Planner = Callable[[Plan], Plan]
"""Plans micro-batches on a plan's stages; returns a scored plan (``prediction`` set)."""


def layer_counts(plan: Plan) -> Counts:
    """``plan``'s cuts: the number of layers of each stage."""
    return tuple(len(stage.layers) for stage in plan.stages)


def with_counts(plan: Plan, counts: Counts) -> Plan:
    """``plan`` with its layers (in order) re-cut into stages of ``counts`` layers; ranks, sizes and
    recompute flags stay with the stage index, the prediction is dropped.

    Raises:
        ValueError: ``counts`` has another number of stages, a stage without layers, or another total.
    """
    names = [name for stage in plan.stages for name in stage.layers]
    if len(counts) != plan.n_stages or min(counts) < 1 or sum(counts) != len(names):
        raise ValueError(f"cuts {counts} do not split {len(names)} layers into {plan.n_stages} non-empty stages")
    stages, first = [], 0
    for stage, count in zip(plan.stages, counts, strict=True):
        stages.append(replace(stage, layers=tuple(names[first:first + count])))
        first += count
    return replace(plan, stages=tuple(stages), prediction=None)


def cut_moves(counts: Counts) -> list[Counts]:
    """Every cut one boundary move away: one layer passed from a stage to a neighbour that keeps at
    least one layer each (``(2, 3)`` → ``[(1, 4), (3, 2)]``)."""
    moves = []
    for k in range(len(counts) - 1):
        for delta in (-1, 1):
            left, right = counts[k] + delta, counts[k + 1] - delta
            if left >= 1 and right >= 1:
                moves.append((*counts[:k], left, right, *counts[k + 2:]))
    return moves


def equal_cuts(base: Plan, plans: Iterable[Plan], count: int = 3) -> list[Counts]:
    """The first ``count`` cuts of ``plans`` (e.g. the balanced planner's candidates, fastest first)
    of the base's method and stage count, other than the base's own: the best equal cuts at other
    micro-batch counts, for :func:`search_cuts`'s ``others``."""
    cuts = dict.fromkeys(layer_counts(p) for p in plans if p.method is base.method and p.n_stages == base.n_stages)
    cuts.pop(layer_counts(base), None)
    return list(cuts)[:count]


def _seconds(plan: Plan) -> float:
    if plan.prediction is None:
        raise ValueError("the micro-batch planner returned a plan without a prediction; score it")
    return plan.prediction.iteration_s


def search_cuts(start: Plan, run: Planner, screen: Planner, *, rounds: int = 3,
                others: Iterable[Counts] = ()) -> Plan:
    """The fastest plan found over stage cuts and micro-batch sizes together (module docstring).

    Args:
        start: the base plan, whose cuts are planned in full whatever the search finds.
        run: the full micro-batch planner.
        screen: a short run of it, to compare cuts.
        rounds: hill-climbing rounds of cut moves (0: screen ``others`` only).
        others: more cuts to screen first.

    Returns:
        ``run``'s plan on the start's cuts, or on the best screened cuts when that is faster.
    """
    screened: dict[Counts, float] = {}

    def time_of(counts: Counts) -> float:
        if counts not in screened:
            screened[counts] = _seconds(screen(with_counts(start, counts)))
        return screened[counts]

    first = layer_counts(start)
    best = min(dict.fromkeys([first, *others]), key=time_of)
    for _ in range(rounds):
        moves = cut_moves(best)
        nearest = min(moves, key=time_of, default=best)
        if time_of(nearest) >= time_of(best):
            break
        best = nearest
    planned = run(start)
    log.debug("cut search: %d cuts screened, best %s (%.6f s) from %s", len(screened), best, screened[best], first)
    if best == first:
        return planned
    moved = run(with_counts(start, best))
    return moved if _seconds(moved) < _seconds(planned) else planned
