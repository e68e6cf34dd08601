"""Iteration time of UEDP plans: a vectorised evaluator for a whole GA population (its loop twin: loop_time).

The model is UMPIPE's flush schedule with unequal micro-batches (Zhou, Tian, Buyya, Wu, IEEE TPDS
2025, doi:10.1109/TPDS.2024.3515804). Only the paper's abstract is public; the recurrence and its
closed form below are **pipetrain's reconstruction** (docs/algorithms.md §2.3), not the paper's text.

Notation (stage ``k`` of ``K``, a batch of ``B`` samples). Forward micro-batch ``j`` of stage ``k``
covers samples ``(X[k, j-1], X[k, j]]`` of size ``x[k, j]``; backward micro-batch ``j`` covers
``(Y[k, j-1], Y[k, j]]`` of size ``y[k, j]``, in forward sample order (the order
:func:`pipetrain.schedule.fill_drain.gpipe_orders` emits). ``f[k](b)``, ``g[k](b)``: forward and
backward seconds on ``b`` samples; ``cF[k](b)``, ``cB[k](b)``: seconds to send ``b`` samples'
activations to ``k + 1`` or gradients to ``k - 1`` (one FIFO channel per link, overlapped with
compute)::

    forward   RF[k, j] = arrival at k of the upstream message holding sample X[k, j]   (0 for k = 0)
              FE[k, j] = max(FE[k, j-1], RF[k, j]) + f[k](x[k, j]),     FE[k, 0] = 0
              CF[k, j] = max(CF[k, j-1], FE[k, j]) + cF[k](x[k, j]),    CF[k, 0] = -inf
    backward  RB[k, j] = arrival at k of the downstream message holding sample Y[k, j] (-inf for k = K-1)
              BE[k, j] = max(BE[k, j-1], RB[k, j]) + g[k](y[k, j]),     BE[k, 0] = FE[k, m_k]
              CB[k, j] = max(CB[k, j-1], BE[k, j]) + cB[k](y[k, j]),    CB[k, 0] = -inf
    T = max_k (BE[k, n_k] + step[k])

Each chain ``E_j = max(E_{j-1}, r_j) + d_j`` has the max-plus closed form

    S_j = S_{j-1} + d_j,  S_0 = 0,        E_j = S_j + max(E_0, max_{i <= j} (r_i - S_{i-1}))

which is one ``cumsum`` and one running maximum. :func:`iteration_times` evaluates it for ``P``
plans at once (TiDGAP's two levels: individuals and micro-batches), looping only over the
``2K`` compute passes and ``2K - 2`` link passes. Plans arrive as per-sample cut masks ``[P, K, B]``
(True where a micro-batch ends, docs/algorithms.md §2.4). The ``K`` forward and ``K`` backward rows
are parsed together into one layout (:class:`~pipetrain.simulate.cut_layout._Layout`): each row's
micro-batches are packed to the left of a ``[P, W + 1]`` slice of one ``[2K, P, W + 1]`` grid
(column 0 holds ``E_0``), ``W`` being the most micro-batches any plan has in any row; the scans run
left to right, so cells past a plan's last micro-batch change nothing that is read. What does not
depend on the chains is done once per call for all rows: the sums ``S`` of all ``4K`` duration rows
(one gather from :attr:`StageTables.chain_costs`, one scatter, one ``cumsum``), and where each
micro-batch finds its ready time: a downstream micro-batch is ready when the upstream message
holding its last sample has arrived (one running count of cuts for both passes,
:func:`~pipetrain.simulate.cut_layout._sources`). Each chain is then four to six array calls
(:func:`_pass`).
:func:`~pipetrain.simulate.loop_time.iteration_time` runs the same closed form micro-batch by
micro-batch for one plan (DGAP's one-individual-at-a-time evaluation) with the same floating-point
operations in the same order, so the two return bit-identical times.

Recompute (docs/algorithms.md §2.6): a stage whose backward partition differs from its forward one re-runs
forward per backward micro-batch, so its ``g`` is ``StageTables.backward_recompute_s`` (``f + g``)
instead of ``backward_s``; both evaluators choose per plan and stage, exactly as
:meth:`pipetrain.plan.plan.Plan.recomputes` does for the simulator and the runtime.

Both equal the event simulator (:func:`pipetrain.simulate.events.simulate` over
:func:`pipetrain.schedule.generators.build_schedule` of a ``uedp`` plan) when the tables come from
:meth:`StageTables.from_cost_model`: the simulator's makespan is the last STEP's end, hence the
``step`` term (:class:`StageTables` carries the per-stage step seconds; leave it empty for zero).

Cost: ``O(P K B)`` to read the masks plus ``O(P K W)`` for the scans, per call; measured on a
2-core CPU, ``P = 128, K = 8, B = 256`` takes about 0.9 ms once the GA has converged (``W`` ≈ 25),
``K = 4, B = 64`` about 0.2 ms.
The two scans run on torch's CPU kernels (:func:`_running_sum`, :func:`_running_max`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pipetrain.simulate.cut_layout import BoolArray, IntArray, _Layout, _layout, _recompute_codes
from pipetrain.simulate.stage_tables import FloatArray, StageTables

__all__ = ["StageTables", "iteration_times"]

_NEG_INF = float("-inf")
_SCAN_CELLS = 32768
"""torch's ``GRAIN_SIZE``: its CPU ``cumsum`` stays on one thread up to this many cells."""


def _running_sum(grid: FloatArray) -> None:
    """In place on ``[R, C]``: each row's prefix sums, added one by one from the left, so the bits
    are the loop's (torch's CPU kernel keeps one running total per row; ~5x numpy's ``cumsum`` on
    the GA's ``[128, ~25]`` grids). In chunks of at most :data:`_SCAN_CELLS` cells, which torch runs
    on the calling thread: on a busy machine, waiting for a second thread cost milliseconds."""
    if grid.size <= _SCAN_CELLS:
        torch.from_numpy(grid).cumsum_(dim=1)
        return
    for chunk in torch.split(torch.from_numpy(grid), max(1, _SCAN_CELLS // grid.shape[1])):
        chunk.cumsum_(dim=1)


def _running_max(grid: torch.Tensor, out: torch.Tensor, indices: torch.Tensor) -> None:
    """``out``: each row of ``grid`` ``[R, C]``'s running maximum (exact in any order; ~2x numpy's);
    ``indices``: ``[R, C]`` int64 scratch."""
    torch.cummax(grid, dim=1, out=(out, indices))


class _Grids:
    """The grids of one evaluation, laid out as :class:`~pipetrain.simulate.cut_layout._Layout`'s
    rows, in one zeroed buffer.

    Attributes:
        sums: ``[2, 2K, P, W + 1]`` ``S``, the running sums of the durations: compute (``f``
            forward, ``g`` backward) in layer 0, links (``cF``, ``cB``) in layer 1.
        slack: ``[2K, P, W + 1]`` each row's slack while it is scanned; zeros where unwritten.
        done: ``[2K, P, W + 1]`` compute end times ``E``.
        sent: ``[2K, P, W + 1]`` link arrival times ``C``.
        maxima: ``[P, W + 1]`` the running maximum of the slack being scanned.
        slack_t, maxima_t: torch views of ``slack`` and ``maxima``, for the scans.
        indices: ``[P, W + 1]`` int64 scratch for them.
    """

    def __init__(self, layout: _Layout, codes: IntArray, costs: FloatArray, n_plans: int) -> None:
        n_rows, width = len(layout.spans) - 1, layout.width + 1
        buffer = np.zeros((5 * n_rows + 1, n_plans, width))
        flat = buffer[: 2 * n_rows].reshape(2, -1)
        for layer in (0, 1):
            flat[layer][layout.cell] = costs[layer].take(codes)
        _running_sum(buffer[: 2 * n_rows].reshape(-1, width))
        self.sums = buffer[: 2 * n_rows].reshape(2, n_rows, n_plans, width)
        self.slack, self.done, self.sent = (buffer[i * n_rows:(i + 1) * n_rows] for i in (2, 3, 4))
        self.maxima = buffer[-1]
        self.slack_t, self.maxima_t = torch.from_numpy(self.slack), torch.from_numpy(self.maxima)
        self.indices = torch.empty((n_plans, width), dtype=torch.int64)


def _pass(rows: Sequence[int], grids: _Grids, layout: _Layout, sources: IntArray, start: FloatArray) -> None:
    """One direction (forward or backward) through ``rows``, in the order the pass visits them:
    fills their ``done`` and ``sent`` grids.

    Each chain is the closed form of the module docstring on its row: the slack's column 0 is
    ``E_0``, its micro-batch cells ``r_j - S_{j-1}`` (compute) or ``E_j - S_{j-1}`` (link, with
    ``C_0 = -inf``), each taken as one contiguous difference against the ``S`` grid shifted by one
    cell (the padding past a plan's last micro-batch only changes cells further right, never read);
    then ``E = running max + S``. The first row's input is ready before its stage is free (at 0
    forward, never waited for backward), so its chain is ``E = S + E_0``.

    Args:
        rows: the rows of :class:`~pipetrain.simulate.cut_layout._Layout` this pass visits, in order.
        sources: :func:`~pipetrain.simulate.cut_layout._sources`, where rows ``1 .. 2K - 2`` read
            their ready times.
        start: ``[2K, P]`` when each row's stage is free to start (>= 0).
    """
    spans, lo, maxima, maxima_t = layout.spans, layout.spans[1], grids.maxima, grids.maxima_t
    slack_flat, sent_flat = grids.slack.reshape(-1), grids.sent.reshape(-1)
    for i, r in enumerate(rows):
        s_compute, slack, slack_t, done = grids.sums[0, r], grids.slack[r], grids.slack_t[r], grids.done[r]
        flat = slack.reshape(-1)
        if i == 0:
            np.add(s_compute, start[r][:, None], out=done)
        else:
            slack_flat[layout.cell[spans[r]:spans[r + 1]]] = sent_flat[sources[spans[r] - lo:spans[r + 1] - lo]]
            np.subtract(flat[1:], s_compute.reshape(-1)[:-1], out=flat[1:])
            slack[:, 0] = start[r]
            _running_max(slack_t, maxima_t, grids.indices)
            np.add(maxima, s_compute, out=done)
        if i + 1 < len(rows):  # the FIFO link towards the next row's stage
            s_link = grids.sums[1, r]
            np.subtract(done.reshape(-1)[1:], s_link.reshape(-1)[:-1], out=flat[1:])
            slack[:, 0] = _NEG_INF
            _running_max(slack_t, maxima_t, grids.indices)
            np.add(maxima, s_link, out=grids.sent[r])


def _check_cuts(forward_cuts: BoolArray, backward_cuts: BoolArray, tables: StageTables) -> None:
    want = (tables.n_stages, tables.batch_size)
    named = (("forward_cuts", forward_cuts), ("backward_cuts", backward_cuts))
    for name, cuts in named[: 1 if backward_cuts is forward_cuts else 2]:
        if cuts.ndim != 3 or cuts.shape[1:] != want:
            raise ValueError(f"{name} must have shape [P, {want[0]}, {want[1]}], got {cuts.shape}")
        if not np.all(cuts[..., -1]):
            raise ValueError(f"{name}[..., -1] must be True: the last micro-batch ends at the last sample")
    if forward_cuts.shape != backward_cuts.shape:
        raise ValueError(f"cut masks differ in shape: {forward_cuts.shape} vs {backward_cuts.shape}")


def iteration_times(forward_cuts: BoolArray, backward_cuts: BoolArray, tables: StageTables) -> FloatArray:
    """Iteration seconds of ``P`` UEDP plans at once (TiDGAP's evaluator; see the module docstring).

    Args:
        forward_cuts: ``[P, K, B]`` bool; ``[p, k, i]`` is True where a forward micro-batch of
            stage ``k`` ends at sample ``i`` (0-based). The last column must be True.
        backward_cuts: ``[P, K, B]`` bool, the same for backward (forward sample order); pass
            the very same array as ``forward_cuts`` for single-chromosome plans, which then are
            read once and never recompute.
        tables: costs, ``[K, B + 1]`` each.

    Returns:
        ``[P]`` iteration seconds ``T``.
    """
    same = backward_cuts is forward_cuts
    forward_cuts = np.asarray(forward_cuts, bool)
    backward_cuts = forward_cuts if same else np.asarray(backward_cuts, bool)
    _check_cuts(forward_cuts, backward_cuts, tables)
    n_plans, n_stages, _ = forward_cuts.shape
    layout, sources = _layout(forward_cuts, backward_cuts)
    codes = layout.code
    if tables.recompute_costs and not same:
        codes = _recompute_codes(layout, forward_cuts, backward_cuts)
    grids = _Grids(layout, codes, tables.chain_costs, n_plans)
    start = np.zeros((2 * n_stages, n_plans))
    _pass(range(n_stages), grids, layout, sources, start)
    done = grids.done.reshape(-1)
    start[n_stages:] = done[layout.last[: n_stages * n_plans]].reshape(n_stages, n_plans)
    _pass(range(2 * n_stages - 1, n_stages - 1, -1), grids, layout, sources, start)
    finish = done[layout.last[n_stages * n_plans:]].reshape(n_stages, n_plans)
    return np.asarray((finish + tables.step_s[:, None]).max(axis=0), dtype=np.float64)
