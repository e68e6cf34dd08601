"""train's summary line: each rank's predicted peak memory against the measured one (the CUDA allocator's
when there is one, else what the runtime counts)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipetrain.cli.run import _summarise_memory
from pipetrain.graph.zoo import build_model
from pipetrain.plan.memory import StageMemory
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime import TrainConfig, TrainResult
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


def test_a_mixed_precision_run_gets_its_line_and_a_mismatched_profile_no_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a bf16 run, the line comes from a profile estimated at bf16; a --profile at fp32 gives "no
    prediction", not an error once training is over."""
    graph = build_model("mlp-digits")
    names = tuple(layer.name for layer in graph.layers)
    plan = Plan("mlp-digits", graph.fingerprint(), 32, Method.GPIPE,
                (StagePlan(names, (0,), (32,), (32,)),), precision="bf16")
    config = TrainConfig(steps=2)
    result = TrainResult((1.0,), (0.1,), 40.0, Timeline((), 1, "measured"),
                         memory=(MeasuredMemory(1024, 1024, 0, 2048, rank=0),))
    _summarise_memory(argparse.Namespace(profile=None), graph, plan, config, result, None)
    assert "peak memory per stage, predicted → measured" in capsys.readouterr().out
    fp32 = tmp_path / "profile.json"
    estimate_profile(graph, "cpu", 32).save(fp32)
    _summarise_memory(argparse.Namespace(profile=fp32), graph, plan, config, result, None)
    said = " ".join(capsys.readouterr().out.split())
    assert "peak memory: no prediction" in said and "is at fp32 but the plan is at bf16" in said
