"""Stage → rank placement: which rank runs each stage, as a property of the method.

Three placements, ``K`` stages on ``R`` ranks:

* **single**: one stage per rank (``K = R``; replicated stages take several ranks), stage ``k`` on
  the ranks the plan names;
* **looping** (interleaved 1F1B, Narayanan et al. 2021 §2.2): ``v = K / R`` chunks per rank, stage
  ``s`` on rank ``s mod R``;
* **V** (ZB-V, Qi et al. 2024 "Zero Bubble Pipeline Parallelism" §6): two chunks per rank
  (``K = 2R``), stage ``s`` on rank ``s`` for ``s < R`` and on rank ``2R − 1 − s`` for ``s >= R``.
  Rank 0 holds the first and the last stage; rank ``R − 1`` holds stages ``R − 1`` and ``R``, which
  hand a micro-batch to each other on the same rank, without a message. ``R = 3``::

      stage  0 1 2 3 4 5
      rank   0 1 2 2 1 0

A placement fixes ``stage → rank``; :func:`placed_ranks` is what :meth:`Plan.validate
<pipetrain.plan.plan.Plan.validate>` compares a plan's stages with, and :func:`local_edges` the stage
edges whose two ends share a rank (the communication pass sends nothing along them, the runtime hands
the tensor over in memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

__all__ = ["Placement", "local_edges", "placed_ranks", "v_rank"]


class Placement(str, Enum):
    """How a method places stages on ranks (module docstring)."""

    SINGLE = "single"
    LOOPING = "looping"
    V = "v"


def v_rank(stage: int, n_ranks: int) -> int:
    """The rank of ``stage`` in the V placement: ``s`` for ``s < R``, else ``2R − 1 − s``.

    >>> [v_rank(s, 3) for s in range(6)]
    [0, 1, 2, 2, 1, 0]
    """
    return stage if stage < n_ranks else 2 * n_ranks - 1 - stage


def placed_ranks(placement: Placement, n_stages: int, n_ranks: int) -> tuple[tuple[int, ...], ...] | None:
    """Every stage's ranks under a multi-stage placement (``((rank,), …)``, one per stage), or None
    for :attr:`Placement.SINGLE`, whose stages name their own ranks."""
    if placement is Placement.LOOPING:
        return tuple((k % n_ranks,) for k in range(n_stages))
    if placement is Placement.V:
        return tuple((v_rank(k, n_ranks),) for k in range(n_stages))
    return None


def local_edges(edges: Sequence[tuple[int, int]], stage_ranks: Sequence[Sequence[int]]) -> frozenset[tuple[int, int]]:
    """The stage edges ``(a, b)`` whose stages both run on one and the same single rank (V: ``(R − 1, R)``)."""
    return frozenset((a, b) for a, b in edges
                     if len(stage_ranks[a]) == 1 and tuple(stage_ranks[a]) == tuple(stage_ranks[b]))
