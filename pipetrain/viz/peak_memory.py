"""One line for ``pipetrain train``'s summary: each rank's predicted peak memory against the measured one.

    peak_memory_line(plan, stage_memory(plan, cost), result)
    # 'peak memory per stage, predicted → measured (CUDA allocator): stage 0 1.2 MiB → 1.5 MiB (1.25×), ...'

Predicted: the memory model's (:func:`~pipetrain.simulate.memory.stage_memory`), summed over a
rank's stages. Measured: on CUDA, the allocator's peak per rank (``TrainResult.device_peak_bytes``:
every tensor of the rank's process, received messages and temporaries included, which the model
leaves out); on a CPU, what the runtime counts (``TrainResult.memory``: weights, gradients,
optimizer state and saved activations, the model's own terms).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.plan.memory import StageMemory
from pipetrain.plan.plan import Plan
from pipetrain.runtime.job.config import TrainResult
from pipetrain.viz.tables import byte_text

__all__ = ["peak_memory_line"]


def _label(plan: Plan, rank: int) -> str:
    stages = plan.stages_of_rank(rank)
    many = len(stages) > 1 or len(plan.stages[stages[0]].ranks) > 1
    names = f"stages {', '.join(map(str, stages))}" if len(stages) > 1 else f"stage {stages[0]}"
    return f"{names} (rank {rank})" if many else names


def peak_memory_line(plan: Plan, predicted: Sequence[StageMemory], result: TrainResult) -> str:
    """Per rank: the predicted peak bytes, the measured ones and their ratio (module docstring)."""
    on_cuda = bool(result.device_peak_bytes)
    measured = result.device_peak_bytes if on_cuda else tuple(m.total_bytes for m in result.memory)
    source = "CUDA allocator" if on_cuda else "counted by the runtime"
    parts = []
    for rank, got in enumerate(measured):
        want = sum(predicted[k].total_bytes for k in plan.stages_of_rank(rank))
        ratio = f" ({got / want:.2f}×)" if want > 0 else ""
        parts.append(f"{_label(plan, rank)} {byte_text(want)} → {byte_text(got)}{ratio}")
    return f"peak memory per stage, predicted → measured ({source}): {'; '.join(parts)}"
