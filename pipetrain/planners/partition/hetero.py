"""Heterogeneity-aware balanced partition: BaPipe's min–max cut over a given device order.

docs/algorithms.md §4.3 (pipetrain's reconstruction of BaPipe, arXiv 2012.12544). The devices are fixed in
pipeline order ``d_1..d_S``, each with its own per-layer costs; stage ``s`` takes the layers
``j+1..l`` and pays, besides its compute, the transfer of the activation over the cut ``j`` from
``d_{s-1}`` and of its gradient back. The partition minimises the bottleneck ``max_s (F_s + B_s +
C_s)`` subject to each stage fitting its device's memory::

    H[0][0] = 0
    H[s][l] = min_{j < l} max( H[s-1][j],  cost(j+1..l; d_s) + C(j; d_{s-1} -> d_s) )
              subject to  state(j+1..l) + in_flight_s · saved(j+1..l) <= limit_s
    answer H[S][L]; the cuts are read back from the minimising j.

With ``overlap=True`` a stage's term is ``max(cost, C)`` instead of the sum: transfers run on a
link of their own beside compute, as pipetrain's simulator and runtime send, so a slow link bounds
throughput like one more stage rather than adding to one.

Exact, O(L² · S) time (each row is one ``[L+1, L+1]`` array operation), O(L² + L · S) memory. Ties go to
the earliest cut, so the result is deterministic. Pure numerics: numpy arrays in, layer counts out;
:mod:`pipetrain.planners.bapipe` builds the arrays from a CostModel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipetrain.errors import UserError

__all__ = ["HeteroPartition", "StageMemoryLimits", "hetero_partition"]

# (s, j) -> seconds that position s >= 1 pays when the cut before it falls after j layers.
CommFn = Callable[[int, int], float]


@dataclass(frozen=True)
class StageMemoryLimits:
    """Per-stage memory feasibility: a stage fits if ``state + in_flight · saved <= limit``.

    Attributes:
        limit_bytes: ``[S]``, the memory of the device at each pipeline position.
        state_bytes: ``[L]``, per layer, bytes held whatever the schedule (parameters and
            optimizer state).
        saved_bytes: ``[L]``, per layer, activation bytes kept per in-flight unit (e.g. per
            sample, or per micro-batch).
        in_flight: ``[S]``, per position, how many units the schedule keeps at once (GPipe: the
            whole batch; 1F1B: ``min(m, S - k)`` micro-batches on stage ``k``).
    """

    limit_bytes: np.ndarray
    state_bytes: np.ndarray
    saved_bytes: np.ndarray
    in_flight: np.ndarray


@dataclass(frozen=True)
class HeteroPartition:
    """The optimal cut: ``counts[s]`` layers on position ``s`` and the bottleneck it reaches (s)."""

    counts: tuple[int, ...]
    bottleneck_s: float


def hetero_partition(
    costs_s: np.ndarray,
    comm_s: np.ndarray | CommFn | None = None,
    memory: StageMemoryLimits | None = None,
    *,
    overlap: bool = False,
) -> HeteroPartition | None:
    """Layer counts minimising ``max_s (F_s + B_s + C_s)`` for devices in a fixed order.

    Args:
        costs_s: ``[S, L]`` seconds: forward + backward of layer ``l`` (one micro-batch) on the
            device at position ``s``.
        comm_s: ``[S-1, L-1]`` seconds, or a callable ``(s, j) -> seconds``: entry ``[s-1, j-1]``
            (call ``(s, j)``) is what position ``s >= 1`` pays when its first layer is layer ``j``
            (0-based), i.e. for the cut after ``j`` layers; forward activation plus backward
            gradient. None: free communication.
        memory: per-stage memory feasibility; None: no limit.
        overlap: communication runs on its own link, beside compute (as pipetrain's simulator and
            runtime send): a stage's term is ``max(F_s + B_s, C_s)`` instead of §4.3's sum.

    Returns:
        ``S`` counts (each >= 1, summing to ``L``) and the bottleneck seconds; None when no
        partition fits the memory limits.

    Raises:
        UserError: more positions than layers, or arrays of the wrong shape.
    """
    costs = np.asarray(costs_s, dtype=float)
    if costs.ndim != 2 or not 1 <= costs.shape[0] <= costs.shape[1]:
        raise UserError(f"per-device layer costs have shape {costs.shape}; give [S, L] with 1 <= S <= L")
    n_stages, n_layers = costs.shape
    best, cut = _bottleneck_table(costs, _comm_array(comm_s, n_stages, n_layers), memory, overlap=overlap)
    if not np.isfinite(best[n_stages, n_layers]):
        return None
    return HeteroPartition(_read_back(cut), float(best[n_stages, n_layers]))


def _bottleneck_table(
    costs: np.ndarray, comm: np.ndarray, memory: StageMemoryLimits | None, *, overlap: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The DP of the module docstring, one row per position: ``best[s, l] = H[s][l]`` (``[S+1, L+1]``,
    inf where nothing fits) and ``cut[s, l]``, the earliest minimising ``j``."""
    n_stages, n_layers = costs.shape
    prefix = np.concatenate([np.zeros((n_stages, 1)), np.cumsum(costs, axis=1)], axis=1)
    # start[j, e], end[j, e]: a stage of layers j..e-1 (rows: the cut before it, columns: its end)
    start, end = np.meshgrid(np.arange(n_layers + 1), np.arange(n_layers + 1), indexing="ij")
    invalid = start >= end  # a stage takes at least one layer
    best = np.full((n_stages + 1, n_layers + 1), np.inf)
    best[0, 0] = 0.0
    cut = np.zeros((n_stages + 1, n_layers + 1), dtype=int)
    for s in range(n_stages):
        segment = prefix[s][end] - prefix[s][start]
        if s > 0:
            link = comm[s - 1][start]
            segment = np.maximum(segment, link) if overlap else segment + link
        segment[invalid] = np.inf
        if memory is not None:
            segment[~_fits(memory, s, start, end)] = np.inf
        value = np.maximum(best[s][:, None], segment)  # [start, end]
        cut[s + 1] = np.argmin(value, axis=0)  # the first minimum: the earliest cut
        best[s + 1] = value[cut[s + 1], np.arange(n_layers + 1)]
    return best, cut


def _read_back(cut: np.ndarray) -> tuple[int, ...]:
    """Layer counts per position, read back from the last position's end through ``cut``."""
    n_stages, n_layers = cut.shape[0] - 1, cut.shape[1] - 1
    counts, stop = [], n_layers
    for s in range(n_stages, 0, -1):
        first = int(cut[s, stop])
        counts.append(stop - first)
        stop = first
    return tuple(reversed(counts))


def _comm_array(comm_s: np.ndarray | CommFn | None, n_stages: int, n_layers: int) -> np.ndarray:
    """``[S-1, L+1]`` transfer seconds indexed by the cut ``j`` (0 and L padded; never chosen)."""
    padded = np.zeros((max(n_stages - 1, 0), n_layers + 1))
    if comm_s is None or n_stages == 1:
        return padded
    if callable(comm_s):
        table = np.array([[comm_s(s, j) for j in range(1, n_layers)] for s in range(1, n_stages)], dtype=float)
    else:
        table = np.asarray(comm_s, dtype=float)
    if table.shape != (n_stages - 1, n_layers - 1):
        raise UserError(f"communication seconds have shape {table.shape}; give [S-1, L-1] = "
                        f"[{n_stages - 1}, {n_layers - 1}]")
    padded[:, 1:n_layers] = table
    return padded


def _fits(memory: StageMemoryLimits, s: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``[L+1, L+1]`` booleans: whether layers ``start..end-1`` fit the device at position ``s``."""
    state = np.concatenate([[0.0], np.cumsum(np.asarray(memory.state_bytes, dtype=float))])
    saved = np.concatenate([[0.0], np.cumsum(np.asarray(memory.saved_bytes, dtype=float))])
    need = state[end] - state[start] + float(memory.in_flight[s]) * (saved[end] - saved[start])
    return np.asarray(need <= float(memory.limit_bytes[s]))
