"""train's summary line: each rank's predicted peak memory against the measured one (the CUDA allocator's
when there is one, else what the runtime counts)."""

from __future__ import annotations

from pipetrain.plan.memory import StageMemory
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime import TrainResult
from pipetrain.runtime.interp.memory import MeasuredMemory
from pipetrain.simulate.timeline import Timeline
from pipetrain.viz.peak_memory import peak_memory_line

_PLAN = Plan("m", "", 4, Method.GPIPE, (StagePlan(("a",), (0,), (4,), (4,)), StagePlan(("b",), (1,), (4,), (4,))))
_PREDICTED = (StageMemory(1024, 1024, 0, 2048), StageMemory(512, 512, 0, 0))
_COUNTED = (MeasuredMemory(1024, 1024, 0, 2048, rank=0), MeasuredMemory(512, 512, 0, 0, rank=1))


def _result(device_peak: tuple[int, ...]) -> TrainResult:
    return TrainResult((1.0,), (0.1,), 40.0, Timeline((), 2, "measured"), memory=_COUNTED,
                       device_peak_bytes=device_peak)


def test_cpu_compares_the_runtime_count() -> None:
    line = peak_memory_line(_PLAN, _PREDICTED, _result(()))
    assert line == ("peak memory per stage, predicted → measured (counted by the runtime): "
                    "stage 0 4.0 KiB → 4.0 KiB (1.00×); stage 1 1.0 KiB → 1.0 KiB (1.00×)")


def test_cuda_compares_the_allocator_peak() -> None:
    line = peak_memory_line(_PLAN, _PREDICTED, _result((6144, 1024)))
    assert "(CUDA allocator): stage 0 4.0 KiB → 6.0 KiB (1.50×); stage 1 1.0 KiB → 1.0 KiB (1.00×)" in line
