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
(True where a micro-batch ends, docs/algorithms.md §2.4); each stage's micro-batches are packed to the left
of a ``[P, W + 1]`` grid (column 0 holds ``E_0``), ``W`` being the most micro-batches any plan has
there; the scans run left to right, so cells past a plan's last micro-batch change nothing that is
read. A downstream micro-batch
is ready when the upstream message holding its last sample has arrived (one ``searchsorted``).
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
2-core CPU, ``P = 128, K = 8, B = 256`` takes about 1.5–2 ms once the GA has converged (``W`` ≈ 25).
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


class _Cuts(NamedTuple):
    """One stage's micro-batches in all ``P`` plans, packed to the left of a ``[P, W + 1]`` grid.

    ``W`` is the most micro-batches any plan has at this stage (at most ``B``, usually far fewer),
    so the scans of :func:`_compute` and :func:`_link` cost ``O(P W)`` rather than ``O(P B)``.
    Column 0 of the grid holds each plan's initial value; micro-batch ``j`` (0-based) sits in
    column ``j + 1``.

    Attributes:
        flat: ``[M]`` increasing positions ``p * B + i`` where a micro-batch ends (sample ``i``
            of plan ``p``), over all plans.
        size: ``[M]`` its number of samples.
        cell_sums: ``[M]`` the cell ``p * (W + 1) + j``: the column before the micro-batch's own.
        cell_next: ``[M]`` ``cell_sums + 1``, the micro-batch's own cell.
        row: ``[M]`` the plan ``p`` of each micro-batch.
        last_cell: ``[P]`` the cell of each plan's final micro-batch.
        width: ``W``.
    """

    flat: IntArray
    size: IntArray
    cell_sums: IntArray
    cell_next: IntArray
    row: IntArray
    last_cell: IntArray
    width: int


def _same_stages(cuts: BoolArray) -> bool:
    """Whether every stage of every plan has stage 0's row (``[P, K, B]``); the first and last plans
    are checked first (in a GA population they seldom pass: the elite may be an equal plan, a child
    hardly ever is)."""
    return (bool(np.all(cuts[0] == cuts[0, :1])) and bool(np.all(cuts[-1] == cuts[-1, :1]))
            and np.array_equal(cuts, np.broadcast_to(cuts[:, :1], cuts.shape)))


def _stages(cuts: BoolArray) -> list[_Cuts]:
    """Each stage's micro-batches, from ``[P, K, B]`` masks, in one pass over all stages.

    Every row's last entry is a cut, so no micro-batch straddles rows (or stages) and a size is
    the distance to the previous cut in the flattened ``[K, P, B]`` grid. Where every stage of
    every plan has the same row (TiDGAP's equal seeds), the stages share one :class:`_Cuts`.
    """
    n_plans, n_stages, batch = cuts.shape
    if n_stages > 1 and _same_stages(cuts):
        shared: _Cuts = _stages(cuts[:, :1])[0]
        return [shared] * n_stages
    flat = np.flatnonzero(cuts.transpose(1, 0, 2))
    stage_row, col = np.divmod(flat, batch)
    last = np.flatnonzero(col == batch - 1)  # [K * P]
    first = np.concatenate([[0], last[:-1] + 1])
    index = np.arange(len(flat)) - first[stage_row]
    size = np.diff(flat, prepend=-1)
    widths = np.max((last - first).reshape(n_stages, n_plans), axis=1) + 1  # [K]
    stage, row = np.divmod(stage_row, n_plans)
    cell_sums = row * (widths + 1)[stage] + index
    cell_next = cell_sums + 1
    local = flat - stage * (n_plans * batch)
    last_cell = cell_next[last].reshape(n_stages, n_plans)
    spans = zip(first[::n_plans], last[n_plans - 1::n_plans] + 1, strict=True)
    return [_Cuts(local[lo:hi], size[lo:hi], cell_sums[lo:hi], cell_next[lo:hi], row[lo:hi], last_cell[k],
                  int(widths[k])) for k, (lo, hi) in enumerate(spans)]


def _running_sum(grid: FloatArray) -> None:
    """In place on ``[R, C]``: each row's prefix sums, added one by one from the left, so the bits
    are the loop's (torch's CPU kernel keeps one running total per row; ~5x numpy's ``cumsum`` on
    the GA's ``[128, ~25]`` grids)."""
    torch.from_numpy(grid).cumsum_(dim=1)


def _running_max(grid: FloatArray) -> FloatArray:
    """``[R, C]`` -> ``[R, C]``: each row's running maximum (exact in any order; ~2x numpy's)."""
    out: FloatArray = torch.cummax(torch.from_numpy(grid), dim=1).values.numpy()
    return out


def _grid_sums(cuts: _Cuts, duration: FloatArray) -> FloatArray:
    """``S`` on the stage's ``[P, W + 1]`` grid: column ``j`` is the sum of the first ``j`` durations.

    Args:
        cuts: the micro-batches (``M`` in all).
        duration: ``[M]`` durations ``d``.
    """
    sums = np.zeros((len(cuts.last_cell), cuts.width + 1))
    sums.reshape(-1)[cuts.cell_next] = duration
    _running_sum(sums)
    return sums


def _compute(cuts: _Cuts, ready: FloatArray | None, duration: FloatArray, start: FloatArray) -> FloatArray:
    """A stage's chain ``E_j = max(E_{j-1}, r_j) + d_j``, ``E_0 = start``, for every plan at once.

    Closed form on ``[P, W + 1]`` grids: ``S`` (:func:`_grid_sums`) and the slack, whose column 0 is
    ``E_0`` and whose running maximum is ``max(E_0, max_{i <= j} (r_i - S_{i-1}))``; ``E = S + slack``.
    Cells past a plan's last micro-batch hold 0 before the scans, which run left to right, so they
    change nothing that is read.

    Args:
        cuts: the micro-batches (``M`` in all).
        ready: ``[M]`` ready times ``r``; None where none is later than ``start`` (the first
            stage of a pass), so the slack is ``E_0`` throughout and ``E = S + E_0``.
        duration: ``[M]`` durations ``d``.
        start: ``[P]`` the initial end time ``E_0`` of each plan.

    Returns:
        ``[P, W + 1]`` end times: micro-batch ``j`` (0-based) of plan ``p`` at ``[p, j + 1]``.
    """
    sums = _grid_sums(cuts, duration)
    if ready is None:
        sums += start[:, None]
        return sums
    slack = np.zeros_like(sums)
    slack[:, 0] = start
    slack.reshape(-1)[cuts.cell_next] = ready - sums.reshape(-1)[cuts.cell_sums]
    sums += _running_max(slack)
    return sums


def _link(cuts: _Cuts, done: FloatArray, duration: FloatArray) -> FloatArray:
    """The FIFO link after a stage, ``C_j = max(C_{j-1}, E_j) + c_j`` with ``C_0 = -inf``.

    The same closed form as :func:`_compute`, with the ready times already on the grid.

    Args:
        cuts: the stage's micro-batches (``M`` in all).
        done: ``[P, W + 1]`` their end times ``E`` (:func:`_compute`).
        duration: ``[M]`` send seconds ``c``.

    Returns:
        ``[P, W + 1]`` arrival times, laid out as ``done``.
    """
    sums = _grid_sums(cuts, duration)
    slack = np.empty_like(sums)
    flat = slack.reshape(-1)  # E_j - S_{j-1} as one contiguous difference; column 0 is then reset
    np.subtract(done.reshape(-1)[1:], sums.reshape(-1)[:-1], out=flat[1:])
    slack[:, 0] = _NEG_INF
    sums += _running_max(slack)
    return sums


def _pass(
    order: Sequence[int],
    stages: Sequence[_Cuts],
    compute_s: Sequence[FloatArray],
    send_s: FloatArray,
    start: FloatArray,
) -> FloatArray:
    """One direction (forward or backward) through the stages in ``order``.

    The first stage's input is ready before the stage is free (at 0 forward, never waited for
    backward), so its chain needs no ready times.

    Args:
        order: stage indices, in the order the pass visits them.
        stages: per stage, its micro-batches.
        compute_s: per stage, ``[M]`` compute seconds of its micro-batches (``f`` or ``g``).
        send_s: ``[K, B + 1]`` link seconds (``cF`` or ``cB``) towards the next stage in ``order``.
        start: ``[K, P]`` when each stage is free to start (>= 0).

    Returns:
        ``[K, P]`` the end of each stage's last micro-batch.
    """
    last = np.empty_like(start)
    arrival: FloatArray | None = None
    for k, after in zip(order, (*order[1:], None), strict=True):
        cuts = stages[k]
        done = _compute(cuts, arrival, compute_s[k], start[k])
        last[k] = done.reshape(-1)[cuts.last_cell]
        if after is not None:  # FIFO link; the next stage waits for the message holding its last sample
            sent = _link(cuts, done, send_s[k][cuts.size]).reshape(-1)
            downstream = stages[after]
            if downstream is cuts:
                arrival = sent[cuts.cell_next]
            else:
                arrival = sent[cuts.cell_next[np.searchsorted(cuts.flat, downstream.flat)]]
    return last


def _check_cuts(forward_cuts: BoolArray, backward_cuts: BoolArray, tables: StageTables) -> None:
    want = (tables.n_stages, tables.batch_size)
    for name, cuts in (("forward_cuts", forward_cuts), ("backward_cuts", backward_cuts)):
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
    forward_cuts, backward_cuts = np.asarray(forward_cuts, bool), np.asarray(backward_cuts, bool)
    _check_cuts(forward_cuts, backward_cuts, tables)
    n_plans, n_stages, _ = forward_cuts.shape
    forward = _stages(forward_cuts)
    backward = forward if backward_cuts is forward_cuts else _stages(backward_cuts)
    order = range(n_stages)
    f = [tables.forward_s[k][cuts.size] for k, cuts in enumerate(forward)]
    g = [tables.backward_s[k][cuts.size] for k, cuts in enumerate(backward)]
    if tables.recompute_costs and backward is not forward:
        same = np.all(forward_cuts == backward_cuts, axis=2).T.copy()  # [K, P]: the stage keeps activations
        g = [np.where(same[k][cuts.row], g[k], tables.backward_recompute_s[k][cuts.size])
             for k, cuts in enumerate(backward)]
    forward_end = _pass(order, forward, f, tables.send_forward_s, np.zeros((n_stages, n_plans)))
    finish = _pass(order[::-1], backward, g, tables.send_backward_s, forward_end)
    return np.asarray((finish + tables.step_s[:, None]).max(axis=0), dtype=np.float64)
