"""Estimated profiles' per-micro-batch costs: host dispatch, the loss on the last layer, data copies."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from pipetrain.cluster import DEVICE_MODELS, DeviceModel
from pipetrain.graph.dataflow import profiled_layer
from pipetrain.graph.zoo import build_model
from pipetrain.profile.estimate import Kernel, estimate_profile, pass_seconds, trace_kernels

TOY = DeviceModel("toy", peak_flops=1e12, memory_bandwidth_bytes_per_s=1e11, kernel_overhead_s=1e-6,
                  memory_bytes=1 << 30, saturation_flops=1e3)
HOST_BOUND = replace(TOY, host_dispatch_s=1e-3)  # every pass of these tiny layers waits for the host
COPYING = replace(TOY, host_bandwidth_bytes_per_s=1e6)  # a slow host link: copies show


@functools.cache
def graph():  # type: ignore[no-untyped-def]
    return build_model("synthetic", n_layers=2, width=0.05)


def layer_alone_s(device: DeviceModel, i: int, b: int) -> tuple[float, float]:
    """Layer ``i``'s own forward and backward seconds on ``b`` samples (no loss, no copies)."""
    g = graph()
    x = torch.empty(b, *g.input.shape, device="meta")
    forward, backward = trace_kernels(profiled_layer(g, i, device="meta"), x)
    return pass_seconds(forward, device), pass_seconds(backward, device)


def test_pass_seconds_is_the_slower_of_device_and_host() -> None:
    kernels = [Kernel(0, 1e3)] * 4  # 1 µs of overhead + 0.01 µs of bytes each
    assert pass_seconds(kernels, TOY) == pytest.approx(4 * (1e-6 + 1e-8))
    assert pass_seconds(kernels, HOST_BOUND) == pytest.approx(4e-3)  # the host's dispatch
    big = [Kernel(0, 1e9)] * 4  # 10 ms each: the device is the bottleneck, dispatch is hidden
    assert pass_seconds(big, HOST_BOUND) == pytest.approx(4 * (1e-6 + 1e-2))


def test_host_bound_layers_cost_the_same_per_micro_batch_whatever_its_size() -> None:
    profile = estimate_profile(graph(), HOST_BOUND, 16)
    first = profile.layers[0]
    assert first.forward_s[0] == pytest.approx(first.forward_s[-1])  # a fixed cost per micro-batch
    assert first.forward_s[0] >= 5e-3  # at least 5 kernels of 1 ms host dispatch


def test_last_layer_pays_the_loss_per_micro_batch() -> None:
    profile = estimate_profile(graph(), HOST_BOUND, 16)
    last = profile.layers[-1]
    extra = []
    for j, b in enumerate(last.sizes):
        forward, backward = layer_alone_s(HOST_BOUND, len(profile.layers) - 1, b)
        extra.append((last.forward_s[j] - forward, last.backward_s[j] - backward))
    # the loss launches kernels of its own each micro-batch: host-bound, the same cost at every size
    assert all(f >= 1e-3 and g >= 1e-3 for f, g in extra)
    assert all(e == pytest.approx(extra[0]) for e in extra)
    # the first layer pays no loss (and, without a host link, no copy)
    forward, backward = layer_alone_s(HOST_BOUND, 0, last.sizes[-1])
    assert profile.layers[0].forward_s[-1] == pytest.approx(forward)
    assert profile.layers[0].backward_s[-1] == pytest.approx(backward)


def test_first_layer_pays_the_input_copy_and_the_last_the_targets() -> None:
    g = graph()
    with_copy, without = estimate_profile(g, COPYING, 16), estimate_profile(g, TOY, 16)
    for j, b in enumerate(with_copy.layers[0].sizes):
        extra = with_copy.layers[0].forward_s[j] - without.layers[0].forward_s[j]
        assert extra == pytest.approx(1e-6 + b * g.input.bytes_per_sample / 1e6)
        extra = with_copy.layers[-1].forward_s[j] - without.layers[-1].forward_s[j]
        assert extra == pytest.approx(1e-6 + b * g.target.bytes_per_sample / 1e6)
    assert with_copy.layers[0].backward_s == without.layers[0].backward_s


def test_loss_joins_the_backwards_b_part_not_w() -> None:
    profile = estimate_profile(graph(), HOST_BOUND, 16)
    last = profile.layers[-1]
    assert last.weight_grad_s is not None
    _, backward = layer_alone_s(HOST_BOUND, len(profile.layers) - 1, last.sizes[-1])
    assert last.weight_grad_s[-1] <= backward + 1e-12  # W is a share of the layer's own backward


def test_gpu_models_dispatch_from_the_host() -> None:
    for name in ("v100", "a100", "h100"):
        assert 5e-6 <= DEVICE_MODELS[name].host_dispatch_s <= 2e-5  # the cited 5-20 µs range
        assert DEVICE_MODELS[name].host_bandwidth_bytes_per_s is not None
    assert DEVICE_MODELS["cpu"].host_dispatch_s == 0 and DEVICE_MODELS["cpu"].host_bandwidth_bytes_per_s is None
