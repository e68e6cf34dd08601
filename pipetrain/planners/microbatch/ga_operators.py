"""The GA's operators on ``[N, K, B]`` cut masks: random individuals, selection, crossover, mutation.

UMPIPE's DGAP (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) evolves
dual-chromosome individuals, forward and backward cut masks ``[K, B]`` (:mod:`.encoding`); the
operators below are **pipetrain's reconstruction** (docs/algorithms.md §2.4): log-uniform random
cut densities, tournament selection, per-stage row-pair crossover, per-row mutation (flip one cut
bit or shift a cut by ±1 sample) and the forward/backward row sync of dual mode. Every row stays a
valid partition (its last entry a cut), so none needs repair. Each draws only from the
``numpy.random.Generator`` passed in; those that return nothing change their masks in place.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.encoding import BoolArray
from pipetrain.planners.microbatch.ga_state import FloatArray, GAConfig

__all__: list[str] = []


def _random_cuts(n: int, n_stages: int, batch: int, rng: np.random.Generator) -> BoolArray:
    """``[n, K, B]`` random masks; each individual has its own cut density, log-uniform in [1/B, 1]."""
    density = np.exp(rng.uniform(math.log(1.0 / batch), 0.0, size=n))
    cuts = rng.random((n, n_stages, batch)) < density[:, None, None]
    cuts[..., -1] = True
    return cuts


def _tournament(times: FloatArray, n: int, size: int, rng: np.random.Generator) -> npt.NDArray[np.intp]:
    """Indices of ``n`` winners of tournaments of ``size`` (ties: the first drawn)."""
    contestants = rng.integers(0, len(times), size=(n, size))
    winners: npt.NDArray[np.intp] = contestants[np.arange(n), np.argmin(times[contestants], axis=1)]
    return winners


def _crossover(
    parents: npt.NDArray[np.intp], n_stages: int, config: GAConfig, rng: np.random.Generator
) -> npt.NDArray[np.intp]:
    """Which parent each child's stage rows come from: pairs ``(parents[2i], parents[2i + 1])``
    swap stage rows.

    Args:
        parents: ``[2n]`` indices into the population.

    Returns:
        ``[2n, K]`` population index per child and stage: first the children that start from
        ``parents[2i]``, then their mates. Index a ``[P, K, B]`` chromosome with it and
        ``arange(K)`` to get the children's rows.
    """
    a, b = parents[0::2, None], parents[1::2, None]
    crosses = rng.random(len(a)) < config.pair_crossover_p
    swap = (rng.random((len(a), n_stages)) < config.row_swap_p) & crosses[:, None]
    source: npt.NDArray[np.intp] = np.concatenate([np.where(swap, b, a), np.where(swap, a, b)])
    return source


def _sync(forward: BoolArray, backward: BoolArray, p_row: float, rng: np.random.Generator) -> None:
    """In place: each stage with ``p_row`` copies its forward row onto its backward one or the reverse."""
    who, stage = np.nonzero(rng.random(forward.shape[:2]) < p_row)
    to_backward = rng.random(len(who)) < 0.5
    fb, bf = (who[to_backward], stage[to_backward]), (who[~to_backward], stage[~to_backward])
    backward[fb] = forward[fb]
    forward[bf] = backward[bf]


def _mutate(cuts: BoolArray, p_row: float, rng: np.random.Generator) -> None:
    """In place on ``[N, K, B]`` masks: each row mutates with ``p_row``: shift a random existing cut
    by ±1, else flip a random bit.

    A row chooses shift or flip with p 1/2; a shift that has no cut to move, or would move it off
    the row or onto another cut, becomes a flip. The last column is never touched.
    """
    batch = cuts.shape[-1]
    if batch == 1:
        return
    who, stage = np.nonzero(rng.random(cuts.shape[:2]) < p_row)
    rows, n = cuts[who, stage], len(who)
    flip_at = rng.integers(0, batch - 1, size=n)
    wants_shift = rng.random(n) < 0.5
    step = 2 * rng.integers(0, 2, size=n) - 1
    keys = np.where(rows[:, :-1], rng.random((n, batch - 1)), -1.0)
    src = np.argmax(keys, axis=1)
    dst = src + step
    each = np.arange(n)
    in_row = (dst >= 0) & (dst <= batch - 2)
    ok = wants_shift & (keys[each, src] >= 0.0) & in_row
    ok &= ~rows[each, np.where(in_row, dst, src)]
    rows[each, np.where(ok, src, flip_at)] ^= True  # a shift clears its cut (set), a flip flips
    shifted = np.flatnonzero(ok)
    rows[shifted, dst[shifted]] = True
    cuts[who, stage] = rows
