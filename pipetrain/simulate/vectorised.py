"""Iteration time of UEDP plans: a vectorised evaluator for a whole GA population (its loop twin: loop_time).

The model is UMPIPE's flush schedule with unequal micro-batches (Zhou, Tian, Buyya, Wu, IEEE TPDS
2025, doi:10.1109/TPDS.2024.3515804). Only the paper's abstract is public; the recurrence and its
closed form below are **pipetrain's reconstruction** (docs/algorithms.md §2.3), not the paper's text.

Notation (stage ``k`` of ``K``, a batch of ``B`` samples). Forward micro-batch ``j`` of stage ``k``
covers samples ``(X[k, j-1], X[k, j]]`` of size ``x[k, j]``; backward micro-batch ``j`` covers
``(Y[k, j-1], Y[k, j]]`` of size ``y[k, j]``, in forward sample order (the order
:func:`pipetrain.schedule.generators.gpipe_orders` emits). ``f[k](b)``, ``g[k](b)``: forward and
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
are parsed together into one layout (:class:`_Layout`): each row's micro-batches are packed to the
left of a ``[P, W + 1]`` slice of one ``[2K, P, W + 1]`` grid (column 0 holds ``E_0``), ``W`` being
the most micro-batches any plan has in any row; the scans run left to right, so cells past a plan's
last micro-batch change nothing that is read. What does not depend on the chains is done once per
call for all rows: the sums ``S`` of all ``4K`` duration rows (one gather from
:attr:`StageTables.chain_costs`, one scatter, one ``cumsum``), and where each micro-batch finds its
ready time: a downstream micro-batch is ready when the upstream message holding its last sample has
arrived (one ``searchsorted`` for both passes, :func:`_sources`). Each chain is then four to six
array calls (:func:`_pass`).
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
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan

__all__ = ["StageTables", "iteration_times"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.intp]

_NEG_INF = float("-inf")
_SCAN_CELLS = 32768
"""torch's ``GRAIN_SIZE``: its CPU ``cumsum`` stays on one thread up to this many cells."""


def _frozen(values: npt.ArrayLike) -> FloatArray:
    out = np.array(values, dtype=np.float64)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class StageTables:
    """Per-stage cost tables indexed by micro-batch size, in seconds.

    Attributes:
        forward_s: ``f``, ``[K, B + 1]``: forward seconds of stage ``k`` on ``b`` samples.
        backward_s: ``g``, ``[K, B + 1]``: backward seconds (with the forward re-run if recomputing).
        send_forward_s: ``cF``, ``[K, B + 1]``: seconds to send ``b`` samples' activations on the
            link ``k -> k + 1`` (row ``K - 1`` is unused).
        send_backward_s: ``cB``, ``[K, B + 1]``: seconds to send ``b`` samples' input gradients on
            the link ``k -> k - 1`` (row 0 is unused).
        step_s: ``[K]``: the optimizer step after the last backward; empty means zeros.
        backward_recompute_s: ``g`` of a stage that recomputes, ``[K, B + 1]``: backward plus the
            forward re-run; used where a plan's backward partition differs from its forward one.
            Empty means the same as ``backward_s`` (recompute costs nothing: the paper's model).
        backward_input_s: ``B`` of a split backward (method ``zb1``; Qi et al., "Zero Bubble
            Pipeline Parallelism", ICLR 2024), ``[K, B + 1]``: the input-gradient seconds.
        weight_grad_s: ``W`` of a split backward, ``[K, B + 1]``: the weight-gradient seconds.
            Give both or neither; empty (the default) means the tables cannot time a split backward.

    Column 0 (size 0) is never read; :meth:`from_cost_model` sets it to 0. Arrays are copied and
    made read-only.
    """

    forward_s: FloatArray
    backward_s: FloatArray
    send_forward_s: FloatArray
    send_backward_s: FloatArray
    step_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    backward_recompute_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    backward_input_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    weight_grad_s: FloatArray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if not np.size(self.backward_recompute_s):
            object.__setattr__(self, "backward_recompute_s", self.backward_s)
        split = ("backward_input_s", "weight_grad_s")
        if bool(np.size(self.backward_input_s)) != bool(np.size(self.weight_grad_s)):
            raise ValueError("give both backward_input_s and weight_grad_s (a split backward), or neither")
        names = ("forward_s", "backward_s", "send_forward_s", "send_backward_s", "backward_recompute_s",
                 *(split if np.size(self.backward_input_s) else ()))
        tables = {name: _frozen(getattr(self, name)) for name in names}
        shape = tables["forward_s"].shape
        if len(shape) != 2 or shape[0] < 1 or shape[1] < 2:
            raise ValueError(f"forward_s must have shape [K >= 1, B + 1 >= 2], got {shape}")
        for name, table in tables.items():
            if table.shape != shape:
                raise ValueError(f"{name} has shape {table.shape}; every table must be {shape}")
            if not (np.all(np.isfinite(table)) and np.all(table >= 0.0)):
                raise ValueError(f"{name} must hold finite, non-negative seconds")
            object.__setattr__(self, name, table)
        step = _frozen(self.step_s) if np.size(self.step_s) else _frozen(np.zeros(shape[0]))
        if step.shape != (shape[0],) or not np.all(np.isfinite(step)):
            raise ValueError(f"step_s must hold {shape[0]} finite seconds, got shape {step.shape}")
        object.__setattr__(self, "step_s", step)

    @property
    def n_stages(self) -> int:
        return int(self.forward_s.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.forward_s.shape[1]) - 1

    @cached_property
    def recompute_costs(self) -> bool:
        """Whether any stage's recompute table differs from its plain backward table."""
        return not np.array_equal(self.backward_s, self.backward_recompute_s)

    @cached_property
    def chain_costs(self) -> FloatArray:
        """``[2, 3K (B + 1)]``, the vectorised evaluator's lookup: row 0 holds the compute seconds
        ``f``, ``g`` and ``g`` with recompute, row 1 the matching link seconds ``cF``, ``cB``, ``cB``,
        each as ``K`` rows of ``B + 1`` sizes, flattened (``_Layout.code`` indexes them)."""
        compute = np.concatenate((self.forward_s, self.backward_s, self.backward_recompute_s))
        link = np.concatenate((self.send_forward_s, self.send_backward_s, self.send_backward_s))
        return np.stack((compute.reshape(-1), link.reshape(-1)))

    @cached_property
    def rows(self) -> tuple[list[list[float]], ...]:
        """The tables as Python lists, for the per-micro-batch loop of :func:`iteration_time`."""
        tables = (self.forward_s, self.backward_s, self.send_forward_s, self.send_backward_s,
                  self.backward_recompute_s)
        return tuple([[float(v) for v in row] for row in table] for table in tables)

    @cached_property
    def split_rows(self) -> tuple[list[list[float]], list[list[float]]]:
        """``B`` and ``W`` of a split backward as Python lists, ``[K][B + 1]`` each.

        Raises:
            ValueError: the tables have no split-backward costs.
        """
        if not np.size(self.weight_grad_s):
            raise ValueError("these tables cannot time a split backward (method zb1): build them with "
                             "StageTables.from_cost_model, or give backward_input_s and weight_grad_s")
        b_in, w = ([[float(v) for v in row] for row in table] for table in (self.backward_input_s, self.weight_grad_s))
        return b_in, w

    @classmethod
    def from_cost_model(
        cls,
        cost: CostModel,
        stages: Sequence[Sequence[str]],
        ranks: Sequence[int],
        batch: int,
        recompute: bool = False,
    ) -> StageTables:
        """Cost every size ``0..batch`` exactly as the event simulator costs actions, the split
        backward's ``B`` and ``W`` included.

        Args:
            cost: the cost model (its per-action overhead is part of ``f`` and ``g``).
            stages: each stage's layer names, in pipeline order.
            ranks: the rank that runs each stage.
            batch: samples per mini-batch ``B``.
            recompute: include the forward re-run in ``g`` on every stage (the plan's ``recompute``
                flag); ``backward_recompute_s`` includes it in any case.
        """
        n = len(stages)
        if len(ranks) != n:
            raise ValueError(f"{n} stages but {len(ranks)} ranks; give one rank per stage")
        sizes = range(batch + 1)
        f, g, g_rc, c_f, c_b, b_in, w = (np.zeros((n, batch + 1)) for _ in range(7))
        for k, (layers, rank) in enumerate(zip(stages, ranks, strict=True)):
            f[k] = cost.forward_table(layers, batch, rank)
            b_in[k, 1:] = [cost.backward_input_s(tuple(layers), b, rank) for b in sizes[1:]]
            w[k, 1:] = [cost.weight_grad_s(tuple(layers), b, rank) for b in sizes[1:]]
            g_rc[k] = cost.backward_table(layers, batch, rank, True)
            g[k] = g_rc[k] if recompute else cost.backward_table(layers, batch, rank, False)
            if k + 1 < n:
                c_f[k, 1:] = [cost.transfer_s(cost.output_bytes(layers, b), rank, ranks[k + 1]) for b in sizes[1:]]
            if k > 0:
                c_b[k, 1:] = [cost.transfer_s(cost.input_bytes(layers, b), rank, ranks[k - 1]) for b in sizes[1:]]
        step = np.array([cost.step_s(layers, rank) for layers, rank in zip(stages, ranks, strict=True)])
        return cls(f, g, c_f, c_b, step, g_rc, b_in, w)

    @classmethod
    def from_plan(cls, plan: Plan, cost: CostModel) -> StageTables:
        """Tables for a chain plan's stages, ranks, batch and ``recompute`` flag (one rank per stage)."""
        replicated = [k for k, s in enumerate(plan.stages) if len(s.ranks) != 1]
        if replicated:
            raise UserError(f"stage {replicated[0]} runs on several ranks; uedp plans need one rank per stage")
        return cls.from_cost_model(
            cost, [s.layers for s in plan.stages], [s.ranks[0] for s in plan.stages], plan.batch_size, plan.recompute
        )


# ---- vectorised: [P] plans at once -----------------------------------------------------------


class _Layout(NamedTuple):
    """The micro-batches of ``R`` rows of masks in all ``P`` plans, packed to the left of one
    ``[R, P, W + 1]`` grid.

    :func:`_layout` builds ``R = 2K`` rows: row ``k`` is stage ``k`` forward, row ``K + k`` stage
    ``k`` backward. ``W`` is the most micro-batches any plan has in any row (at most ``B``, usually
    far fewer), so the scans cost ``O(R P W)`` rather than ``O(R P B)``. Column 0 holds each chain's
    initial value; micro-batch ``j`` (0-based) of plan ``p`` in row ``r`` sits in column ``j + 1``,
    the cell ``(r P + p)(W + 1) + j + 1`` of the flattened grid.

    Attributes:
        flat: ``[M]`` increasing positions ``(r P + p) B + i`` where a micro-batch ends (sample
            ``i``), over all rows and plans.
        code: ``[M]`` ``r (B + 1) + size``: the micro-batch's entry in
            :attr:`StageTables.chain_costs` (its number of samples in its row's table).
        cell: ``[M]`` its own cell.
        last: ``[R P]`` the cell of each row and plan's final micro-batch.
        spans: ``R + 1`` offsets: row ``r``'s micro-batches are ``[spans[r], spans[r + 1])``.
        width: ``W``.
    """

    flat: IntArray
    code: IntArray
    cell: IntArray
    last: IntArray
    spans: list[int]
    width: int


def _steps(values: IntArray) -> IntArray:
    """``[N]`` increasing ``values`` -> ``[N]`` their differences, the first from -1."""
    out = np.empty_like(values)
    out[:1] = values[:1] + 1
    np.subtract(values[1:], values[:-1], out=out[1:])
    return out


def _parse(rows: BoolArray) -> _Layout:
    """The layout of ``[R, P, B]`` masks (every row's last entry a cut), in one pass over all rows;
    no micro-batch straddles rows, so a size is the distance to the previous cut in the flat grid."""
    _, n_plans, batch = rows.shape
    flat = np.flatnonzero(rows)
    line, col = np.divmod(flat, batch)  # line = r P + p
    last = np.flatnonzero(col == batch - 1)  # [R P]
    counts = _steps(last)  # micro-batches per line
    width = int(counts.max())
    shift = np.arange(1, len(last) * (width + 1), width + 1) - (last + 1 - counts)  # [R P]: cell - index
    cell = np.arange(len(flat)) + shift[line]
    code = (line // n_plans) * (batch + 1) + _steps(flat)  # + size
    spans = [0, *(last[n_plans - 1::n_plans] + 1).tolist()]
    return _Layout(flat, code, cell, cell[last], spans, width)


def _tiled(layout: _Layout, n_plans: int, batch: int, times: int) -> _Layout:
    """``layout``'s ``R`` rows repeated ``times`` times: row ``t R + r`` is row ``r``."""
    n_rows = len(layout.spans) - 1
    tile = np.arange(times)[:, None]
    flat, code, cell, last = (
        (values + tile * (n_rows * step)).reshape(-1)
        for values, step in ((layout.flat, n_plans * batch), (layout.code, batch + 1),
                             (layout.cell, n_plans * (layout.width + 1)), (layout.last, n_plans * (layout.width + 1)))
    )
    spans = [t * layout.spans[-1] + s for t in range(times) for s in layout.spans[:-1]] + [times * layout.spans[-1]]
    return _Layout(flat, code, cell, last, spans, layout.width)


def _same_stages(cuts: BoolArray) -> bool:
    """Whether every stage of every plan has stage 0's row (``[P, K, B]``); the first and last plans
    are checked first (in a GA population they seldom pass: the elite may be an equal plan, a child
    hardly ever is)."""
    return (bool(np.all(cuts[0] == cuts[0, :1])) and bool(np.all(cuts[-1] == cuts[-1, :1]))
            and np.array_equal(cuts, np.broadcast_to(cuts[:, :1], cuts.shape)))


def _layout(forward_cuts: BoolArray, backward_cuts: BoolArray) -> tuple[_Layout, IntArray]:
    """The ``2K`` rows (forward stages, then backward stages) of ``[P, K, B]`` masks, and their
    :func:`_sources`.

    Forward and backward masks are parsed together; where ``backward_cuts is forward_cuts`` the
    ``K`` rows are parsed once and repeated, and where every stage of every plan has the same row
    (TiDGAP's equal seeds) that one row is parsed once and each micro-batch's upstream message is
    the one in its own column.
    """
    n_plans, n_stages, batch = forward_cuts.shape
    if backward_cuts is not forward_cuts:
        layout = _parse(np.concatenate((forward_cuts.transpose(1, 0, 2), backward_cuts.transpose(1, 0, 2))))
    elif n_stages > 1 and _same_stages(forward_cuts):
        layout = _tiled(_parse(forward_cuts[:, :1].transpose(1, 0, 2)), n_plans, batch, 2 * n_stages)
        return layout, _sources(layout, n_stages, n_plans * (layout.width + 1), search=False)
    else:
        layout = _tiled(_parse(forward_cuts.transpose(1, 0, 2)), n_plans, batch, 2)
    return layout, _sources(layout, n_stages, n_plans * batch, search=True)


def _sources(layout: _Layout, n_stages: int, block: int, search: bool) -> IntArray:
    """Where each micro-batch of rows ``1 .. 2K - 2`` finds its ready time: the cell of the
    upstream message holding its last sample.

    Forward row ``k`` reads row ``k - 1`` and backward row ``K + k`` reads row ``K + k + 1``, so a
    key shifted by one row lands in the upstream row; rows ``0`` and ``2K - 1`` open their passes
    and need none.

    Args:
        block: with ``search``, ``P B``: one row's samples; the positions ``layout.flat`` are
            shifted and looked up (one ``searchsorted`` for both passes). Without (all rows equal),
            ``P (W + 1)``: one row's cells; the upstream message is in the micro-batch's own column.

    Returns:
        ``[spans[2K - 1] - spans[1]]`` cells.
    """
    lo, mid, hi = layout.spans[1], layout.spans[n_stages], layout.spans[2 * n_stages - 1]
    keys = layout.flat if search else layout.cell
    query = keys[lo:hi] - block
    query[mid - lo:] += 2 * block
    if not search:
        return query
    sources: IntArray = layout.cell[np.searchsorted(keys, query)]
    return sources


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
    """The grids of one evaluation, laid out as :class:`_Layout`'s rows, in one zeroed buffer.

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
        rows: the rows of :class:`_Layout` this pass visits, in order.
        sources: :func:`_sources`, where rows ``1 .. 2K - 2`` read their ready times.
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


def _recompute_codes(layout: _Layout, forward_cuts: BoolArray, backward_cuts: BoolArray) -> IntArray:
    """``layout.code`` with each backward micro-batch of a stage whose forward and backward rows
    differ pointed ``K`` table rows further on, at ``g`` with recompute (``[P, K, B]`` masks)."""
    n_plans, n_stages, batch = forward_cuts.shape
    differs = np.zeros((n_plans, n_stages), dtype=bool)  # a row index p K + k where any cut differs
    differs.reshape(-1)[np.flatnonzero(forward_cuts != backward_cuts) // batch] = True
    lo = layout.spans[n_stages]
    codes = layout.code.copy()
    codes[lo:] += differs.T.reshape(-1)[layout.flat[lo:] // batch - n_stages * n_plans] * (n_stages * (batch + 1))
    return codes


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
