"""What every micro-batch planner returns: per-stage forward and backward sizes and their time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipetrain.planners.microbatch.encoding import Partition, partition_to_cuts
from pipetrain.simulate.vectorised import StageTables, iteration_times

__all__ = ["MicrobatchPlan", "check_caps", "evaluate"]


@dataclass(frozen=True)
class MicrobatchPlan:
    """A UEDP partition and its predicted iteration time.

    Attributes:
        forward_sizes: per stage, the forward micro-batch sizes (each sums to the batch).
        backward_sizes: per stage, the backward sizes (forward sample order).
        iteration_s: the predicted iteration seconds (:func:`~pipetrain.simulate.vectorised.iteration_times`).
        planner: which planner chose it (``"equal"``, ``"greedy"``, ``"dp"``, ``"tidgap"``...).
        history_s: for the GA, the best time after each generation; empty otherwise.
    """

    forward_sizes: Partition
    backward_sizes: Partition
    iteration_s: float
    planner: str
    history_s: tuple[float, ...] = field(default=())


def evaluate(
    forward_sizes: Sequence[Sequence[int]], backward_sizes: Sequence[Sequence[int]], tables: StageTables, planner: str
) -> MicrobatchPlan:
    """Time one partition with the vectorised evaluator and wrap it as a :class:`MicrobatchPlan`."""
    batch = tables.batch_size
    fwd = partition_to_cuts(forward_sizes, batch)[None]
    bwd = partition_to_cuts(backward_sizes, batch)[None]
    time = float(iteration_times(fwd, bwd, tables)[0])
    return MicrobatchPlan(_as_partition(forward_sizes), _as_partition(backward_sizes), time, planner)


def _as_partition(sizes: Sequence[Sequence[int]]) -> Partition:
    return tuple(tuple(int(x) for x in stage) for stage in sizes)


def check_caps(caps: Sequence[int] | None, n_stages: int) -> tuple[int, ...] | None:
    """Validate per-stage memory caps (largest micro-batch per stage).

    Raises:
        ValueError: not one positive cap per stage.
    """
    if caps is None:
        return None
    out = tuple(int(c) for c in caps)
    if len(out) != n_stages or min(out) < 1:
        raise ValueError(f"caps {list(caps)} must give one size >= 1 for each of {n_stages} stages")
    return out
