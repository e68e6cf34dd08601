"""One generation of the GA in the ask/tell style: :func:`init_state`, :func:`ask`, :func:`tell`.

UMPIPE's DGAP and TiDGAP (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804;
**pipetrain's reconstruction**, docs/algorithms.md §2.4): generation 0 holds the fastest equal
(GPipe) plans, up to half the population, and random individuals; each later generation keeps the
``elite`` best and adds ``P - elite`` children bred by :mod:`.ga_operators`. The functions are pure
apart from drawing from the ``numpy.random.Generator`` passed in (the evotorch functional style of
STYLE.md L8): :func:`ask` returns the children's masks ``[P - elite, K, B]``, the caller times them
(``[P - elite]`` seconds) and :func:`tell` makes the next :class:`~.ga_state.GAState`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipetrain.planners.microbatch.encoding import BoolArray, cap_cuts, equal_seeds
from pipetrain.planners.microbatch.ga_operators import _crossover, _mutate, _random_cuts, _sync, _tournament
from pipetrain.planners.microbatch.ga_state import Evaluator, FloatArray, GAConfig, GAState, Mode, _state
from pipetrain.planners.microbatch.seeding import fastest_seeds, seed_bounds
from pipetrain.simulate.vectorised import StageTables

__all__ = ["ask", "init_state", "tell"]


def init_state(
    tables: StageTables,
    config: GAConfig,
    rng: np.random.Generator,
    evaluate: Evaluator,
    *,
    mode: Mode = "dual",
    caps: Sequence[int] | None = None,
    prune_seeds: bool = False,
    split: bool = False,
) -> GAState:
    """Generation 0: the fastest equal plans (up to half of ``P``), the rest random.

    The kept equal plans are timed once (:func:`~pipetrain.planners.microbatch.seeding.fastest_seeds`);
    ``prune_seeds`` skips those that a lower bound proves slower, with the same result (``split``:
    the evaluator times a split backward, ``zb1-ga``, :func:`~pipetrain.planners.microbatch.seeding.seed_bounds`).
    """
    n_stages, batch = tables.n_stages, tables.batch_size
    seeds = cap_cuts(equal_seeds(n_stages, batch), caps)
    n_keep = min(batch, math.ceil(config.population / 2))
    bounds = seed_bounds(seeds, tables, split) if prune_seeds and n_keep < batch else None  # else every seed is kept
    keep, seed_times = fastest_seeds(seeds, n_keep, evaluate, bounds)
    n_random = config.population - len(keep)
    forward = cap_cuts(_random_cuts(n_random, n_stages, batch, rng), caps)
    backward = forward
    if mode == "dual":
        backward = forward.copy()
        half = n_random // 2
        backward[half:] = cap_cuts(_random_cuts(n_random - half, n_stages, batch, rng), caps)
    times = np.concatenate([seed_times, evaluate(forward, backward) if n_random else []])
    forward, backward = np.concatenate([seeds[keep], forward]), np.concatenate([seeds[keep], backward])
    return _state(forward, backward, times, None)


def ask(
    state: GAState,
    config: GAConfig,
    rng: np.random.Generator,
    *,
    mode: Mode = "dual",
    caps: Sequence[int] | None = None,
) -> tuple[BoolArray, BoolArray]:
    """The ``P - elite`` children of ``state``: forward and backward masks ``[P - elite, K, B]``."""
    n_kids = config.population - config.elite
    parents = _tournament(state.times_s, 2 * math.ceil(n_kids / 2), config.tournament, rng)
    source = _crossover(parents, state.forward.shape[1], config, rng)[:n_kids]
    rows = np.arange(state.forward.shape[1])
    forward = state.forward[source, rows]
    _mutate(forward, config.row_mutation_p, rng)
    if mode == "single":
        forward = cap_cuts(forward, caps)
        return forward, forward
    backward = state.backward[source, rows]
    _mutate(backward, config.row_mutation_p, rng)
    _sync(forward, backward, config.row_sync_p, rng)
    return cap_cuts(forward, caps), cap_cuts(backward, caps)


def tell(state: GAState, forward: BoolArray, backward: BoolArray, times_s: FloatArray, config: GAConfig) -> GAState:
    """The next generation: ``state``'s ``elite`` best, then the evaluated children."""
    elite = np.argsort(state.times_s, kind="stable")[: config.elite]
    return _state(
        np.concatenate([state.forward[elite], forward]),
        np.concatenate([state.backward[elite], backward]),
        np.concatenate([state.times_s[elite], times_s]),
        state,
    )
