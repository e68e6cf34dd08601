"""Estimated profiles: the roofline per kernel, traced kernels, device scaling, sanity numbers."""

from __future__ import annotations

import functools
import itertools
import time

import pytest
import torch
from torch import nn

from pipetrain.cluster import DEVICE_MODELS, DeviceModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.graph.zoo import build_model
from pipetrain.profile.estimate import Kernel, estimate_profile, kernel_seconds, trace_kernels
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.precision import Precision
from pipetrain.profile.table import Profile

DEVICES = ("cpu", "v100", "a100", "h100")  # slowest first


@functools.cache
def gpt1(device: str, precision: Precision = "fp32") -> tuple[Profile, float]:
    """The gpt1-14 estimate at batch 8 (8 × 512 tokens), and the CPU seconds it took (this process's, so
    other work on a shared machine does not count; wall time under a load of 15 took 5× longer)."""
    start = time.process_time()
    profile = estimate_profile(build_model("gpt1-14"), device, 8, precision=precision)
    return profile, time.process_time() - start


def test_kernel_roofline() -> None:
    dev = DeviceModel("toy", peak_flops=1e12, memory_bandwidth_bytes_per_s=1e11,
                      kernel_overhead_s=1e-5, memory_bytes=1 << 30, saturation_flops=1e8)
    assert kernel_seconds(Kernel(0, 1e9), dev) == pytest.approx(1e-5 + 1e-2)  # memory-bound
    assert kernel_seconds(Kernel(1e6, 0), dev) == pytest.approx(1e-5 + 1e-4)  # under-used
    assert kernel_seconds(Kernel(1e11, 1e6), dev) == pytest.approx(1e-5 + 1e-1)  # compute-bound


def test_linear_kernels_on_meta() -> None:
    layer = nn.Linear(1024, 4096, device="meta")
    forward, backward = trace_kernels(layer, torch.empty(8, 1024, device="meta"))
    assert [k.flops for k in forward] == [2 * 8 * 1024 * 4096]  # one addmm; views are free
    assert forward[0].bytes_moved == 4 * (4096 + 1024 * 4096 + 8 * 1024 + 8 * 4096)
    assert sum(k.flops for k in backward) == 2 * forward[0].flops  # input and weight gradients


@pytest.mark.parametrize("device", DEVICES)
def test_gpt1_estimates_quickly_and_sensibly(device: str) -> None:
    profile, seconds = gpt1(device)
    assert seconds < 10
    assert len(profile.layers) == 14 and profile.device == device
    block = profile.layer("block0")
    assert block.sizes == (1, 2, 4, 8)
    assert block.flops_per_sample == 2 * 12 * 768**2 * 512 + 2 * 12 * 512 * 512 * 128
    assert all(b > f > 0 for f, b in zip(block.forward_s, block.backward_s, strict=True))
    assert list(block.forward_s) == sorted(block.forward_s)


def test_gpt1_block_is_milliseconds_on_v100() -> None:
    # Public figure to check against: a GPT-1-size block is ~58 GFLOP for 8 × 512 tokens,
    # about 1 ms of tensor-core time (fp16) on a V100 at 60-70 % of its 125 TFLOP/s; 8x that in fp32 (15.7 TFLOP/s).
    block = gpt1("v100", "fp16")[0].layer("block0")
    assert 0.5e-3 < block.forward_s[-1] < 3e-3
    assert 1e-3 < block.backward_s[-1] < 8e-3
    assert 4e-3 < gpt1("v100")[0].layer("block0").forward_s[-1] < 12e-3


def test_estimate_scales_with_device_speed() -> None:
    for a, b in itertools.pairwise(DEVICES):
        slow, fast = gpt1(a)[0], gpt1(b)[0]
        for ls, lf in zip(slow.layers, fast.layers, strict=True):
            assert ls.forward_s[-1] > lf.forward_s[-1] and ls.backward_s[-1] > lf.backward_s[-1]


@pytest.mark.parametrize("device", DEVICES)
def test_vgg16_estimates_quickly(device: str) -> None:
    start = time.process_time()  # this process's CPU seconds, as for gpt1
    profile = estimate_profile(build_model("vgg16"), device, 32)
    assert time.process_time() - start < 10
    assert len(profile.layers) == 16
    assert profile.layer("conv1_1").output_bytes_per_sample == 64 * 224 * 224 * 4


def test_estimate_agrees_with_measurement_on_counts() -> None:
    graph = build_model("gpt-tiny")
    estimated = estimate_profile(graph, "cpu", 4, sizes=(4,))
    measured = measure_profile(graph, 4, sizes=(4,), warmup=0, repeats=1)
    for e, m in zip(estimated.layers, measured.layers, strict=True):
        assert e.flops_per_sample == m.flops_per_sample
        assert e.output_bytes_per_sample == m.output_bytes_per_sample
        assert e.parameter_bytes == m.parameter_bytes
        # fused attention saves q, k, v, out and log-sum-exp, not a [b, heads, T, T] matrix
        assert e.saved_bytes_per_sample == pytest.approx(m.saved_bytes_per_sample, rel=1e-3)
        assert e.held_grad_bytes_per_sample == m.held_grad_bytes_per_sample  # the same shapes


def test_cpu_model_is_within_a_small_factor_of_this_machine() -> None:
    """The cpu device model is not absurd here. The bounds are wide (×20 each way): a loaded machine
    (CI, or the suite's other worker) measures several times slower than the model; the model's
    accuracy is BENCHMARKS.md's, not a timed test's."""
    graph = build_model("mlp", n_layers=1)
    estimated = estimate_profile(graph, "cpu", 64, sizes=(64,)).layers[0]
    measured = measure_profile(graph, 64, sizes=(64,), repeats=3).layers[0]
    assert 0.05 < estimated.forward_s[0] / measured.forward_s[0] < 20
    assert 0.05 < estimated.backward_s[0] / measured.backward_s[0] < 20


def test_json_round_trip() -> None:
    profile = estimate_profile(build_model("mlp-digits"), DEVICE_MODELS["a100"], 16)
    assert profile.source.startswith("estimated for a100")
    assert Profile.from_json(profile.to_json()) == profile


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum() * x


def test_meta_failures_and_unknown_devices_are_user_errors() -> None:
    graph = LayerGraph.from_layers(
        [("odd", DataDependent())], input=TensorSpec((4,)), target=TensorSpec((4,))
    )
    with pytest.raises(UserError, match="cannot run on the meta device"):
        estimate_profile(graph, "v100", 2)
    with pytest.raises(UserError, match="unknown device model 'tpu'"):
        estimate_profile(build_model("mlp-digits"), "tpu", 2)
