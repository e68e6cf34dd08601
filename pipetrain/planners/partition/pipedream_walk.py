"""The tie-broken stages of PipeDream's partitioner and their flattening (docs/algorithms.md §3.3).

Once the suffix DP (:mod:`.pipedream_dp`) has the optimum, a second DP over stage counts, with the
optimum (times ``1 + 1e-9``) as a limit on every stage and cut, picks the answer the ties ask for:
fewest stages, then, from the input side, the earliest cut, the fewest replicas for that stage and
the fewest devices after it (:func:`_stage_counts`, ``counts[d, s]`` by components ``d`` and first
layer ``s``; walked by :func:`_walk` as ``(first, end, replicas, components after)`` stages).
**Flattening** (:func:`_flatten`): a stage ``[i, j)`` on ``m`` components of a level runs, in each
component, the level below's optimal sub-pipeline of ``[i, j)``; a level-1 stage of ``r`` replicas
becomes a flat :class:`~.pipedream_types.DPStage` of ``r * m`` devices, recursively through every
level.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipetrain.planners.partition.pipedream_costs import _INF, Array, Ints, _Costs
from pipetrain.planners.partition.pipedream_types import DPStage

__all__: list[str] = []

_TIE_RTOL = 1e-9


def _stage_counts(costs: _Costs, start: int, end: int, limit_s: float) -> tuple[Array, Array]:
    """Fewest stages with every term ``<= limit_s``: ``(counts[d, s], root[m])``.

    ``counts[d, s]`` covers ``[s, end)`` on exactly ``d`` components with the input cut at ``s``;
    ``root[m]`` covers ``[start, end)`` on exactly ``m`` components, without an input cut.
    """
    m_max, reps = costs.machines, costs.replicas
    r_of, d_of, starts, m_of = costs.splits
    counts = np.full((m_max + 1, end + 1), _INF)
    prefix = counts.copy()  # running minimum over s from i + 1
    root = np.full(m_max + 1, _INF)
    for i in range(end - 1, start - 1, -1):
        np.minimum(prefix[:, i + 1 : end], counts[:, i + 1, None], out=prefix[:, i + 1 : end])
        allowed = _allowed(costs, i, end, limit_s)
        cut_fits = costs.cut_s[i] / reps <= limit_s
        single = np.where(allowed[:, 0] >= end - i, 1.0, _INF)
        row, row_in = np.full(m_max + 1, _INF), np.full(m_max + 1, _INF)
        row[reps], row_in[reps] = single, np.where(cut_fits, single, _INF)
        if r_of.size and i + 1 < end:
            last = np.minimum(allowed[r_of - 1, d_of], end - i - 1) - 1
            rest = np.where(last >= 0, prefix[d_of, i + 1 + np.maximum(last, 0)] + 1, _INF)
            row[m_of] = np.minimum(row[m_of], np.minimum.reduceat(rest, starts))
            rest_in = np.where(cut_fits[r_of - 1], rest, _INF)
            row_in[m_of] = np.minimum(row_in[m_of], np.minimum.reduceat(rest_in, starts))
        counts[:, i], root = row_in, row
    return counts, root


def _allowed(costs: _Costs, i: int, end: int, limit_s: float) -> Ints:
    """``[R, M+1]``: how many stage ends ``s = i+1, ...`` (up to ``end``) keep the stage ``<= limit_s``
    and in memory, by replicas and components downstream (stage time rises with ``s``)."""
    time_s, rows, fits = costs.first_stage(i)
    allowed: Ints = np.minimum(np.count_nonzero(time_s[:, : end - i] <= limit_s, axis=1)[rows], fits)
    return allowed


def _next_stage(
    costs: _Costs, i: int, end: int, limit_s: float, counts: Array, n_stages: float, budget: int | None
) -> tuple[int, int, int]:
    """The tie-broken ``(stage end, replicas, components left)`` of an optimal stage starting at ``i``
    with ``n_stages`` to go on exactly ``budget`` components; ``None``: the root, any count, no cut."""
    reps = costs.replicas
    allowed = _allowed(costs, i, end, limit_s)
    usable = np.ones(reps.size, dtype=bool) if budget is None else costs.cut_s[i] / reps <= limit_s
    single = usable & (allowed[:, 0] >= end - i) & (n_stages == 1)
    r_of, d_of, _, _ = costs.splits
    hits = counts[:, i + 1 : end] == n_stages - 1
    first_hit = np.argmax(np.hstack([hits, np.ones((hits.shape[0], 1), dtype=bool)]), axis=1)  # end - i - 1: none
    split = usable[r_of - 1] & (first_hit[d_of] < np.minimum(allowed[r_of - 1, d_of], end - i - 1))
    if budget is not None:
        single &= reps == budget
        split &= r_of + d_of == budget
    ends = np.concatenate([np.full(int(single.sum()), end), i + 1 + first_hit[d_of[split]]])
    r_all = np.concatenate([reps[single], r_of[split]])
    d_all = np.concatenate([np.zeros(int(single.sum()), dtype=np.intp), d_of[split]])
    if not ends.size:
        raise AssertionError("the stage-count DP and its walk disagree")
    pick = np.lexsort((d_all, r_all, ends))[0]
    return int(ends[pick]), int(r_all[pick]), int(d_all[pick])


def _walk(costs: _Costs, start: int, end: int, limit_s: float) -> list[tuple[int, int, int, int]]:
    """Optimal stages ``(first, end, replicas, components after)`` of ``[start, end)`` at this level."""
    counts, root = _stage_counts(costs, start, end, limit_s)
    n_stages = float(root.min())
    stages = []
    i, budget = start, None
    while i < end:
        stop, r, budget = _next_stage(costs, i, end, limit_s, counts, n_stages, budget)
        stages.append((i, stop, r, budget))
        i, n_stages = stop, n_stages - 1
    return stages


def _flatten(
    tables: Sequence[Sequence[_Costs]], k: int, g: int, start: int, end: int, limit_s: float, bases: tuple[int, ...]
) -> list[DPStage]:
    """Flat stages of ``[start, end)`` at level ``k`` (0-based) and stash grid point ``g``, run in each
    of the components of level ``k`` whose first devices are ``bases``; a stage takes the next ``r``
    machines of each component."""
    costs = tables[k][g]
    flat: list[DPStage] = []
    used = 0
    for first, stop, r, after in _walk(costs, start, end, limit_s):
        machines = tuple(b + (used + i) * costs.inner_devices for b in bases for i in range(r))
        used += r
        if k == 0:
            flat.append(DPStage(first, stop, len(machines), tuple(sorted(machines))))
        else:
            sub = int(costs.sub_rows[r - 1, after])
            inner_s = float(costs.compute_s[sub, first, stop]) * (1 + _TIE_RTOL)
            flat.extend(_flatten(tables, k - 1, sub, first, stop, inner_s, machines))
    return flat
