"""Generation 0's equal seeds: the fastest ``keep`` of them, timing as few as a bound allows.

UMPIPE's GA (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804; operators
reconstructed in docs/algorithms.md §2.4) starts from the fastest equal (GPipe) plans, which
:func:`~pipetrain.planners.microbatch.encoding.equal_seeds` lists as ``[B, K, B]`` cut masks, one
per micro-batch count. Timing all ``B`` of them is about half of a short TiDGAP run, and most are
hopeless: a plan with many micro-batches pays each one's overhead on every stage. The bound

    T >= max_k (Σ_j f_k(x_j) + Σ_j g_k(x_j) + step_k)

(stage ``k`` runs its forwards and its backwards one at a time, in whatever order; pipetrain's, not
the paper's)
rules them out before they are timed. :func:`fastest_seeds` returns exactly the seeds, and the
times, that timing all of them would give: every seed it skips is provably slower than the ``keep``
it returns.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.encoding import BoolArray
from pipetrain.simulate.vectorised import StageTables

__all__ = ["fastest_seeds", "seed_bounds"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
Evaluator = Callable[[BoolArray, BoolArray], FloatArray]

_SLACK = 1e-6
"""Relative margin under each bound: covers the rounding of its sums and of the evaluator's."""


def seed_bounds(seeds: BoolArray, tables: StageTables, split: bool = False) -> FloatArray:
    """Lower bounds on the iteration seconds of single-chromosome plans (backward = forward), in any
    order of a stage's actions (flush, 1F1B, ZB-H1).

    Args:
        seeds: ``[N, K, B]`` cut masks, used for forward and backward.
        tables: costs ``[K, B + 1]``.
        split: the backward runs split into ``B`` and ``W`` (``zb1-ga``): ``g`` is
            ``backward_input_s + weight_grad_s``.

    Returns:
        ``[N]`` ``max_k (Σ_j f_k(x_j) + Σ_j g_k(x_j) + step_k)``, lowered by a relative ``1e-6``.
    """
    n, n_stages, batch = seeds.shape
    backward = tables.backward_input_s + tables.weight_grad_s if split else tables.backward_s
    cost = tables.forward_s + backward  # [K, B + 1]
    busy = np.empty((n, n_stages))
    for k in range(n_stages):
        if k == 0 or not np.array_equal(seeds[:, k], seeds[:, k - 1]):  # equal seeds: every stage alike
            flat = np.flatnonzero(seeds[:, k])  # [M] positions p * B + i of the cuts
            size, plan = np.diff(flat, prepend=-1), flat // batch  # rows end in a cut: no straddling
        busy[:, k] = np.bincount(plan, weights=cost[k, size], minlength=n)
    bound: FloatArray = (busy + tables.step_s).max(axis=1) * (1.0 - _SLACK)
    return bound


def fastest_seeds(
    seeds: BoolArray, keep: int, evaluate: Evaluator, bounds: FloatArray | None = None
) -> tuple[IntArray, FloatArray]:
    """The ``keep`` fastest seeds, fastest first (ties: lower index), and their times.

    Without ``bounds`` every seed is timed in one call (DGAP). With them (TiDGAP), seeds are timed
    in rounds, lowest bound first, until no untimed seed's bound reaches the ``keep``-th best time
    found; the result is the same.

    Args:
        seeds: ``[N, K, B]`` single-chromosome plans.
        keep: how many to return, ``1 <= keep <= N``.
        evaluate: the population evaluator, called with the same array as forward and backward.
        bounds: ``[N]`` lower bounds on the seeds' times (:func:`seed_bounds`), or None.

    Returns:
        ``[keep]`` indices into ``seeds`` and ``[keep]`` their iteration seconds.
    """
    if bounds is None:
        times = evaluate(seeds, seeds)
    else:
        times = np.full(len(seeds), np.inf)
        todo = np.argsort(bounds, kind="stable")[:keep]
        while todo.size:
            chosen = seeds[todo]
            times[todo] = evaluate(chosen, chosen)
            threshold = np.partition(times, keep - 1)[keep - 1]
            todo = np.flatnonzero((bounds <= threshold) & np.isinf(times))
    kept: IntArray = np.argsort(times, kind="stable")[:keep]
    return kept, times[kept]
