"""The GA's hyperparameters and its immutable generation state (DGAP / TiDGAP, :mod:`.ga`).

UMPIPE (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) searches UEDP plans
with a dual-chromosome GA; its hyperparameters are unpublished, so :class:`GAConfig` holds
**pipetrain's choices** (docs/algorithms.md §2.4). A generation is a :class:`GAState`: the
population's forward and backward cut masks ``[P, K, B]`` (:mod:`.encoding`), their iteration
seconds ``[P]`` and the fastest individual seen so far (masks ``[K, B]``), all read-only, so
:func:`~.ga_step.ask` and :func:`~.ga_step.tell` can stay pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.encoding import BoolArray

__all__ = ["Evaluator", "FloatArray", "GAConfig", "GAState", "Mode"]

FloatArray = npt.NDArray[np.float64]
Mode = Literal["dual", "single"]
Evaluator = Callable[[BoolArray, BoolArray], FloatArray]
"""``(forward [N, K, B], backward [N, K, B]) -> [N]`` iteration seconds."""


@dataclass(frozen=True)
class GAConfig:
    """GA hyperparameters (pipetrain's choices; the paper's are unknown).

    Attributes:
        population: individuals per generation ``P``.
        generations: generations ``G`` to run.
        tournament: contestants per tournament.
        pair_crossover_p: probability that a pair of parents crosses over.
        row_swap_p: in a crossing pair, probability that a stage's rows (forward and backward
            together) are swapped.
        row_mutation_p: probability that a row (one stage of one chromosome) mutates.
        row_sync_p: dual mode, probability that a stage's forward row is copied onto its backward
            one or the reverse, so that equal rows (no recompute) are easy to reach.
        coupled_fraction: dual mode, the share of the generations, first, in which children keep
            backward = forward (a single-chromosome phase); the rest search both freely.
        elite: best individuals copied unchanged into the next generation.
        cut_rounds: rounds of stage-cut moves searched together with the sizes, each cut screened
            by a run of a tenth of the generations (:mod:`pipetrain.planners.cut_search`); 0 plans
            the base plan's cuts only. Used where the planner plans a chain's stages
            (:func:`~pipetrain.planners.unequal.plan_unequal`), not by the GA itself.
    """

    population: int = 128
    generations: int = 500
    tournament: int = 3
    pair_crossover_p: float = 0.8
    row_swap_p: float = 0.5
    row_mutation_p: float = 0.15
    row_sync_p: float = 0.1
    coupled_fraction: float = 0.5
    elite: int = 2
    cut_rounds: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.elite < self.population:
            raise ValueError(f"elite ({self.elite}) must be >= 0 and below the population ({self.population})")
        if self.generations < 0 or self.tournament < 1 or self.cut_rounds < 0:
            raise ValueError("generations and cut_rounds must be >= 0 and tournament >= 1")
        for name in ("pair_crossover_p", "row_swap_p", "row_mutation_p", "row_sync_p", "coupled_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]")


class GAState(NamedTuple):
    """One generation, immutable (its arrays are read-only).

    Attributes:
        forward: ``[P, K, B]`` forward cut masks.
        backward: ``[P, K, B]`` backward cut masks.
        times_s: ``[P]`` iteration seconds of each individual.
        best_forward: ``[K, B]`` the fastest individual seen so far, forward.
        best_backward: ``[K, B]`` its backward masks.
        best_s: its iteration seconds.
        generation: generations completed.
    """

    forward: BoolArray
    backward: BoolArray
    times_s: FloatArray
    best_forward: BoolArray
    best_backward: BoolArray
    best_s: float
    generation: int


def _freeze(*arrays: npt.NDArray[np.generic]) -> None:
    for array in arrays:
        array.setflags(write=False)


def _state(forward: BoolArray, backward: BoolArray, times: FloatArray, previous: GAState | None) -> GAState:
    """A state whose best is the better of ``previous``'s best and this population's (ties: older)."""
    i = int(np.argmin(times))
    generation = 0 if previous is None else previous.generation + 1
    if previous is not None and previous.best_s <= times[i]:
        best = (previous.best_forward, previous.best_backward, previous.best_s)
    else:
        best = (forward[i].copy(), backward[i].copy(), float(times[i]))
    _freeze(forward, backward, times, best[0], best[1])
    return GAState(forward, backward, times, best[0], best[1], best[2], generation)

