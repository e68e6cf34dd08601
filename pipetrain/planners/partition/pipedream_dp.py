"""The suffix DP of PipeDream's partitioner, with the best cut found by binary search (docs/algorithms.md §3.3).

Over suffixes, ``A[i, j, m]`` is the best seconds per item of span ``[i, j)`` on exactly ``m``
components of one level, ``d`` of them after the first stage and ``r'`` the first replication of
the rest::

    A[i, j, m] = min( T(i, j, m),  min_{i<s<j, r+d=m} max(T(i, s, r), cut_s / r', A[s, j, d]) )

``T`` and ``cut_s`` come from :class:`~.pipedream_costs._Costs`. Solving from the output side (the
public code starts from the input) makes ``d`` exact, which the memory check needs. ``T(i, s, r)``
rises with ``s`` while the running minimum of ``A[s', j, d]`` over ``s' <= s`` falls, so the best
cut is where they cross (:func:`_best_split`): ``O(L^3 M + L^2 M^2 log L)`` for every span of a
level, ``O(L^2 M + L M^2 log L)`` for one span; loops run over the first layer only.
"""

from __future__ import annotations

import numpy as np

from pipetrain.planners.partition.pipedream_costs import _INF, Array, Ints, _Costs

__all__: list[str] = []


def _best_split(time_s: Array, prefix: Array, last: Ints, time_row: Ints, d_row: Ints, first: int) -> Array:
    """``[E, P]``: ``min over s <= last of max(time_s[row, s], rest[e, d, first + s])`` by binary search.

    ``prefix[e, d, s]`` is the running minimum of the rest over ``s`` from ``first``, so it falls as
    ``s`` grows while ``time_s`` rises: the best ``s`` is where they cross, and ``max(time_s, prefix)``
    has the same minimum as ``max(time_s, rest)``. ``last[e, p]`` bounds ``s`` (``-1``: no split).
    """
    n_e, n_d, n_s = prefix.shape
    rest_flat, time_flat = prefix.reshape(-1), time_s.reshape(-1)
    rest_at = (np.arange(n_e)[:, None] * n_d + d_row[None, :]) * n_s + first  # + s: flat index of rest
    time_at = time_row[None, :] * time_s.shape[1]  # + s: flat index of time_s
    lo, hi = np.zeros_like(last), last + 1  # the crossing lies in [lo, hi]; hi = last + 1: none
    for _ in range(int(last.max(initial=0) + 1).bit_length()):
        mid = (lo + hi) // 2
        probe = np.minimum(mid, np.maximum(last, 0))
        rises = time_flat[time_at + probe] >= rest_flat[rest_at + probe]
        hi = np.where(rises & (lo < hi), mid, hi)
        lo = np.where(~rises & (lo < hi), mid + 1, lo)
    at = np.where(lo <= last, time_flat[time_at + np.minimum(lo, np.maximum(last, 0))], _INF)
    before = np.where(lo >= 1, rest_flat[rest_at + np.maximum(lo - 1, 0)], _INF)
    return np.minimum(at, before)


def _suffix_dp(costs: _Costs, ends: Ints) -> Array:
    """``[L+1, len(ends)]``: best time per item of span ``[i, ends[e])`` on at most ``M`` components.

    ``into[e, d, s]`` is the best for ``[s, ends[e])`` on exactly ``d`` components with the input cut
    at ``s`` charged to its first stage; the loop over ``i`` goes from the output side.
    """
    n, m_max, reps = costs.cut_s.size - 1, costs.machines, costs.replicas
    r_of, d_of, starts, m_of = costs.splits
    best = np.full((n + 1, ends.size), _INF)
    into = np.full((ends.size, m_max + 1, n + 1), _INF)
    prefix = into.copy()  # running minimum of `into` over s from i + 1
    for i in range(n - 1, -1, -1):
        lo = int(np.searchsorted(ends, i + 1))
        if i + 1 < n:
            np.minimum(prefix[lo:, :, i + 1 :], into[lo:, :, i + 1, None], out=prefix[lo:, :, i + 1 :])
        time_s, rows, fits = costs.first_stage(i)
        span = ends[lo:] - i - 1
        exact = np.full((span.size, m_max + 1), _INF)
        exact[:, reps] = np.where(span[:, None] < fits[:, 0], time_s[rows[:, 0][:, None], span].T, _INF)
        exact_in = exact.copy()
        exact_in[:, reps] = np.maximum(exact[:, reps], costs.cut_s[i] / reps)
        if r_of.size and i + 1 < n:
            last = np.minimum(span[:, None] - 1, fits[r_of - 1, d_of] - 1)
            split = _best_split(time_s, prefix[lo:], last, rows[r_of - 1, d_of], d_of, i + 1)
            exact[:, m_of] = np.minimum(exact[:, m_of], np.minimum.reduceat(split, starts, axis=1))
            split_in = np.maximum(split, costs.cut_s[i] / r_of)
            exact_in[:, m_of] = np.minimum(exact_in[:, m_of], np.minimum.reduceat(split_in, starts, axis=1))
        into[lo:, :, i] = exact_in
        best[i, lo:] = exact.min(axis=1)
    return best
