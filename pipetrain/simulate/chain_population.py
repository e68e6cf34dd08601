"""Iteration times of a whole population of chain plans under the 1F1B or ZB-H1 order, at once.

The GA planners ``1f1b-ga`` and ``zb1-ga`` (:mod:`pipetrain.planners.microbatch.ga`) time unequal
per-stage partitions (forward = backward) under their method's order. One plan at a time that is
:func:`~pipetrain.schedule.one_f_one_b.one_f_one_b_sequences` (with
:func:`~pipetrain.schedule.zero_bubble.zb1_sequences` for ZB-H1, Qi et al., ICLR 2024, §2.1) and
then :func:`~pipetrain.simulate.chain.order_time` (:func:`~pipetrain.simulate.chain.split_order_time`):
Python loops over the ``O(K m)`` actions of each plan. :func:`population_order_times` does the
same work for ``P`` plans together, on
``[P, K]`` and ``[P, K, M]`` arrays (``M`` the most micro-batches of any stage of any plan):

1. **The F/B order as counts.** Stage ``k``'s unequal 1F1B order (warm-up bound ``K - k``) runs
   ``i[k, j]`` forwards before its backward ``j``::

       need[k, j] = max(X[k, j], before[k + 1, d])     d: the first micro-batch of k + 1 ending at or after X[k, j]
       c[k, j]    = 1 + #{i : X[k, i] < need[k, j]}    the forwards that cover need
       i[k, j]    = max(i[k, j - 1], min(m_k, max(j + K - k, c[k, j])))
       before[k, j] = X[k, i[k, j] - 1]

   (``X[k, j]``: the end of micro-batch ``j``, 1-based), one running maximum per stage, last stage
   first: exactly the loop of ``one_f_one_b_sequences``.
2. **ZB-H1's W actions** (``split=True``) are placed as :func:`~pipetrain.schedule.zero_bubble.place_weight_grads`
   places them (deferred at most ``k`` on stage ``k``, at most ``K`` micro-batches held from F to
   W before a forward, one W after every B in the cool-down), as a state per stage: the B and W
   counts (pending W actions are the micro-batches ``w .. b - 1``), the micro-batches held, and
   whether the last action was a B that releases a W.
3. **The play-out** runs in rounds: in each, every stage whose next action's input has been sent
   runs it (``end = max(free, arrival) + cost``; a message's arrival ``max(link, end) + send``), the
   model of :mod:`pipetrain.simulate.chain`. Each value is computed by the same operations in the
   same order as there, so the times are bit-identical (tests/unit/test_chain_population.py).

Cost: ``O(K)`` array calls for the F/B orders, ``O(m)`` for the W placement, then ``O(rounds)``
calls over ``[P K]`` vectors, ``rounds`` about 2.4 times the longest program (``2 m`` or ``3 m``
actions: a stage waits a round for each message). Measured on the 2-core machine (CPU s): 48 random
plans of 14 stages at B = 512 (50 micro-batches on average, 271 at most) 0.11 s against the loops'
0.23 s (1F1B), 0.15 s against 0.30 s (ZB-H1); in auto's 48 × 60 GA for gpt1-14 on 512 A100s, whose
population converges to about 130–170 micro-batches, the GA of ``1f1b-ga`` took 7.9 s and that of
``zb1-ga`` 10.7 s (with the seeds' bound, :mod:`pipetrain.planners.microbatch.seeding`), where their
whole runs had taken 73 s and 69 s, with the same plans.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipetrain.simulate.stage_tables import StageTables

__all__ = ["population_order_times"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class _Layout:
    """Per plan and stage, its micro-batches packed to the left of ``M`` columns.

    Attributes (``N = P K`` rows, row ``p K + k``):
        m: ``[N]`` micro-batch counts.
        ends: ``[N, M]`` 1-based end samples ``X``; ``B`` past the last micro-batch.
        sizes: ``[N, M]`` micro-batch sizes; 0 past the last.
        below: ``[N, B + 1]`` ``below[r, x]``: the micro-batches of row ``r`` that end before sample ``x``
            (1-based), i.e. its cuts at positions ``< x``.
    """

    def __init__(self, cuts: BoolArray) -> None:
        n_plans, n_stages, batch = cuts.shape
        rows = cuts.reshape(n_plans * n_stages, batch)
        self.below = np.zeros((len(rows), batch + 1), dtype=np.int64)
        np.cumsum(rows, axis=1, out=self.below[:, 1:])
        self.m = self.below[:, -1]
        width = int(self.m.max())
        row, pos = np.nonzero(rows)
        column = np.arange(len(row)) - np.repeat(np.cumsum(self.m) - self.m, self.m)
        self.ends = np.full((len(rows), width), batch, dtype=np.int64)
        self.ends[row, column] = pos + 1
        self.sizes = np.diff(self.ends, axis=1, prepend=0)

    def count_below(self, rows: slice, ends: IntArray) -> IntArray:
        """``[N', M]``: per row of ``rows``, how many of its micro-batches end before each of ``ends``."""
        return np.take_along_axis(self.below[rows], ends - 1, axis=1)


def population_order_times(cuts: BoolArray, tables: StageTables, split: bool = False) -> FloatArray:
    """Iteration seconds of ``P`` chain plans under the unequal 1F1B order (``split``: ZB-H1's).

    Args:
        cuts: ``[P, K, B]`` cut masks (True where a micro-batch ends; the last column True), one
            partition per stage used for both passes.
        tables: stage costs ``[K, B + 1]``; with ``split``, split-backward rows (``B`` and ``W``).
        split: time the ZB-H1 order (backward split into B and W) as
            :func:`~pipetrain.simulate.chain.split_order_time` does; else the 1F1B order as
            :func:`~pipetrain.simulate.chain.order_time` does.

    Returns:
        ``[P]`` seconds, equal to the one-plan functions' to the last bit.

    Raises:
        ValueError: the masks and tables disagree, or the tables have no split rows and ``split``.
    """
    n_plans, n_stages, batch = cuts.shape
    if (n_stages, batch) != (tables.n_stages, tables.batch_size) or not cuts[..., -1].all():
        raise ValueError(f"give [P, {tables.n_stages}, {tables.batch_size}] cut masks, each row ending in a cut")
    if split and not np.size(tables.weight_grad_s):
        raise ValueError("these tables cannot time a split backward (method zb1): build them with "
                         "StageTables.from_cost_model")
    layout = _Layout(cuts)
    stage = np.tile(np.arange(n_stages), n_plans)
    before = _forwards_before(layout, n_plans, n_stages)
    free = _play_out(layout, before, stage, tables, split)
    times: FloatArray = (free.reshape(n_plans, n_stages) + tables.step_s).max(axis=1)
    return times


def _forwards_before(layout: _Layout, n_plans: int, n_stages: int) -> IntArray:
    """``[N, M]``: the forwards each stage runs before each of its backwards (step 1 above)."""
    width = layout.ends.shape[1]
    j = np.arange(width)
    counts = np.zeros_like(layout.ends)
    ends = layout.ends.reshape(n_plans, n_stages, width)
    m = layout.m.reshape(n_plans, n_stages)
    later = None  # ``before`` of stage k + 1: [P, M]
    for k in range(n_stages - 1, -1, -1):
        rows = slice(k, None, n_stages)
        need = ends[:, k]
        if later is not None:
            down = layout.count_below(slice(k + 1, None, n_stages), need)  # d per micro-batch
            need = np.maximum(need, np.take_along_axis(later, np.minimum(down, width - 1), axis=1))
        cover = layout.count_below(rows, need) + 1
        wanted = np.minimum(m[:, k, None], np.maximum(j + (n_stages - k), cover))
        counts[rows] = np.maximum.accumulate(wanted, axis=1)
        later = np.take_along_axis(ends[:, k], counts[rows] - 1, axis=1)
    return counts


def _programs(layout: _Layout, before: IntArray, n_stages: int, split: bool) -> tuple[IntArray, IntArray, IntArray]:
    """Each stage's program: per position its kind (0 F, 1 B, 2 W; 3 past the end) and micro-batch,
    ``[N, L + 1]`` each (``L`` the longest program), and the programs' lengths ``[N]`` (steps 1-2 above)."""
    n_rows, width = layout.ends.shape
    m, j = layout.m, np.arange(width)
    valid = j < m[:, None]
    row = np.broadcast_to(np.arange(n_rows)[:, None], (n_rows, width))
    fb = np.zeros((n_rows, 2 * width), dtype=bool)  # the F/B order: True where a B runs
    fb[row[valid], (before + j)[valid]] = True
    if not split:
        w_before = np.zeros((n_rows, 2 * width), dtype=np.int64)
    else:
        w_before = _weight_grads_before(fb, m, n_stages)
    size = 3 if split else 2
    kind = np.full((n_rows, size * width + 1), 3, dtype=np.int64)
    index = np.zeros_like(kind)
    t = np.arange(2 * width)
    fb_valid = t < 2 * m[:, None]
    position = (t + w_before)[fb_valid]
    fb_rows = np.broadcast_to(np.arange(n_rows)[:, None], fb.shape)[fb_valid]
    kind[fb_rows, position] = fb[fb_valid]
    index[fb_rows, position] = (np.where(fb, np.cumsum(fb, axis=1), np.cumsum(~fb, axis=1)) - 1)[fb_valid]
    if split:  # W j follows the F/B actions whose W count before them is at most j
        offset = (np.arange(n_rows) * (width + 1))[:, None]
        keys = np.where(fb_valid, w_before, width) + offset  # rows sorted apart; padding past every j
        fb_before = np.searchsorted(keys.ravel(), (j + offset).ravel(), side="right").reshape(n_rows, width)
        fb_before -= np.arange(n_rows)[:, None] * 2 * width
        kind[row[valid], (fb_before + j)[valid]] = 2
        index[row[valid], (fb_before + j)[valid]] = j[None, :].repeat(n_rows, 0)[valid]
    return kind, index, size * m


def _weight_grads_before(fb: BoolArray, m: IntArray, n_stages: int) -> IntArray:
    """``[N, 2M]``: per F/B action of each stage's order, the W actions ZB-H1 runs before it
    (:func:`~pipetrain.schedule.zero_bubble.place_weight_grads` with delay ``k``, bound ``K``, cool-down)."""
    n_rows, length = fb.shape
    delay = np.arange(n_rows) % n_stages
    pending, held, done = (np.zeros(n_rows, dtype=np.int64) for _ in range(3))
    forwards_left = m.copy()
    out = np.zeros((n_rows, length), dtype=np.int64)
    for t in range(length):
        valid = t < 2 * m
        backward = fb[:, t] & valid
        forward = ~fb[:, t] & valid
        drain = np.where(forward, np.minimum(pending, np.maximum(held - n_stages + 1, 0)), 0)
        pending -= drain
        held += forward.astype(np.int64) - drain
        done += drain
        out[:, t] = done
        forwards_left -= forward
        pending += backward
        release = backward & ((pending > delay) | (forwards_left == 0))
        pending -= release
        held -= release
        done += release
    return out


def _play_out(layout: _Layout, before: IntArray, stage: IntArray, tables: StageTables, split: bool) -> FloatArray:
    """``[N]``: when each stage's last action ends (step 3 above)."""
    n_rows, width = layout.ends.shape
    n_stages, columns = tables.n_stages, tables.batch_size + 1
    kind, index, length = _programs(layout, before, n_stages, split)
    rows = np.arange(n_rows)[:, None]
    first, last = (stage == 0)[:, None], (stage == n_stages - 1)[:, None]
    j = np.minimum(index, width - 1)
    size = layout.sizes[rows, j]
    cell = stage[:, None] * columns + size
    # arrivals: n M + j forward messages of row n (at its next stage), N M + n M + j backward ones
    # (at its previous stage), then the constant cells 0, -inf, +inf (never sent) and a write-only one
    zero, minus, never, dump = 2 * n_rows * width + np.arange(4)
    up = np.zeros_like(layout.ends)
    up[1:] = np.take_along_axis(layout.below[:-1], layout.ends[1:] - 1, axis=1)
    down = np.zeros_like(layout.ends)
    down[:-1] = np.take_along_axis(layout.below[1:], layout.ends[:-1] - 1, axis=1)
    is_f, is_b, is_w = kind == 0, kind == 1, kind == 2
    fwd_cell, bwd_cell = rows * width + j, n_rows * width + rows * width + j
    source = np.select([is_f & first, is_f, is_b & last, is_b, is_w],
                       [zero, fwd_cell - width + up[rows, j] - j, minus, bwd_cell + width + down[rows, j] - j, minus],
                       never)
    compute = (tables.forward_s, tables.backward_input_s if split else tables.backward_s,
               tables.weight_grad_s if split else tables.forward_s)
    cost = np.select([is_f, is_b, is_w], [np.ravel(t)[cell] for t in compute], 0.0)
    sends_f, sends_b = is_f & ~last, is_b & ~first
    target = np.select([sends_f, sends_b], [fwd_cell, bwd_cell], dump)
    link = np.select([sends_f, sends_b], [2 * rows, 2 * rows + 1], 2 * n_rows)
    links_s = (tables.send_forward_s, tables.send_backward_s)
    send = np.select([sends_f, sends_b], [np.ravel(t)[cell] for t in links_s], 0.0)
    arrival = np.full(2 * n_rows * width + 4, np.inf)
    arrival[zero], arrival[minus] = 0.0, -np.inf
    links = np.full(2 * n_rows + 1, -np.inf)
    source_of, cost_of, target_of = source.ravel(), cost.ravel(), target.ravel()
    link_of, send_of = link.ravel(), send.ravel()
    free = np.zeros(n_rows)
    position = np.arange(n_rows) * kind.shape[1]
    remaining = int(length.sum())
    while remaining:
        ready = arrival[source_of[position]]
        go = np.flatnonzero(ready != np.inf)
        if not len(go):
            raise ValueError("the orders deadlock")
        at = position[go]
        end = np.maximum(free[go], ready[go]) + cost_of[at]
        free[go] = end
        used = link_of[at]
        sent = np.maximum(links[used], end) + send_of[at]
        links[used] = sent
        arrival[target_of[at]] = sent
        position[go] += 1
        remaining -= len(go)
    return free
