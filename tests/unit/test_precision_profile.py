"""Profiles at a precision: the JSON field, a measured CPU bf16 profile, estimates at the
tensor-core peak (pipetrain.profile.autocast, .measure, .estimate; issue 28 item 2)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn

from pipetrain.cluster import DEVICE_MODELS
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.profile.autocast import autocast_region, is_parameter_cast, message_bytes, unsupported
from pipetrain.profile.estimate import estimate_profile, peak_flops
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.precision import Precision
from pipetrain.profile.stats import layer_stats
from pipetrain.profile.table import Profile
from tests.conftest import flat_profile


@functools.cache
def gpt1(device: str, precision: Precision) -> Profile:
    """gpt1-14 estimated at 8 samples (8 × 512 tokens) only."""
    return estimate_profile(build_model("gpt1-14"), device, 8, sizes=(8,), precision=precision)


# ---- the JSON field ---------------------------------------------------------------------------


def test_precision_is_in_the_json_only_when_mixed() -> None:
    fp32 = flat_profile(2)
    assert "precision" not in json.loads(fp32.to_json())  # files read as before the field existed
    assert Profile.from_json(fp32.to_json()).precision == "fp32"
    bf16 = Profile(**{**fp32.__dict__, "precision": "bf16"})
    assert json.loads(bf16.to_json())["precision"] == "bf16"
    assert Profile.from_json(bf16.to_json()) == bf16


def test_unknown_precision_and_another_precision_are_refused() -> None:
    data = json.loads(flat_profile(2).to_json())
    with pytest.raises(UserError, match="precision 'fp8' is unknown; use one of fp32, bf16, fp16"):
        Profile.from_json(json.dumps({**data, "precision": "fp8"}))
    with pytest.raises(UserError, match=r"is at fp32 but the plan is at bf16.*--precision bf16"):
        flat_profile(2).check_precision("bf16")


# ---- measured under autocast ------------------------------------------------------------------


class Residual(nn.Module):
    """``x + W x``: a float32 input plus a bf16 matmul is float32 under autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.linear(x)
        return out


def test_saved_and_message_bytes_under_autocast() -> None:
    model, x = Residual(), torch.randn(4, 8)
    with autocast_region(torch.device("cpu"), "bf16"):
        stats, out = layer_stats(model, x)
        assert out.dtype == torch.float32  # the residual add promotes to float32...
        assert message_bytes(out) == 4 * 8 * 2  # ...and the runtime sends it in bf16
    fp32, _ = layer_stats(model, x)
    assert stats.output_bytes_per_sample == fp32.output_bytes_per_sample // 2 == 16
    assert stats.parameter_bytes == fp32.parameter_bytes  # float32 master weights
    assert fp32.saved_bytes_per_sample == 8 * 4  # the Linear's input
    assert stats.saved_bytes_per_sample == 8 * 2  # its bf16 cast; the cast of W is not per sample:
    assert (fp32.cast_weight_bytes, stats.cast_weight_bytes) == (0, 8 * 8 * 2)  # kept once per micro-batch


def test_a_parameter_cast_is_recognised() -> None:
    layer = nn.Linear(8, 16)
    params = frozenset(id(p) for p in layer.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = layer.weight.to(torch.bfloat16).t()
    assert is_parameter_cast(cast, params)
    assert not is_parameter_cast(layer.weight.t(), params)  # a view, no cast: the parameter's own storage
    assert not is_parameter_cast(torch.randn(3, requires_grad=True).to(torch.bfloat16), params)


def test_measured_cpu_bf16_profile() -> None:
    graph = build_model("gpt-tiny")
    fp32 = measure_profile(graph, 4, sizes=(4,), warmup=0, repeats=1)
    bf16 = measure_profile(graph, 4, sizes=(4,), warmup=0, repeats=1, precision="bf16")
    assert bf16.precision == "bf16" and "under bf16 autocast" in bf16.source
    assert all(lp.forward_s[0] > 0 and lp.backward_s[0] > 0 for lp in bf16.layers)
    for a, b in zip(fp32.layers, bf16.layers, strict=True):
        assert b.output_bytes_per_sample == a.output_bytes_per_sample // 2  # every output is floating
        assert b.parameter_bytes == a.parameter_bytes
        assert b.saved_bytes_per_sample <= a.saved_bytes_per_sample  # the embedding saves its int64 indices
        assert a.cast_weight_bytes == 0
    assert sum(lp.saved_bytes_per_sample for lp in bf16.layers) < 0.7 * sum(lp.saved_bytes_per_sample
                                                                              for lp in fp32.layers)
    block = graph.build_layer(graph.index("block0"))
    linears = sum(m.weight.numel() for m in block.modules() if isinstance(m, nn.Linear))
    assert bf16.layer("block0").cast_weight_bytes == 2 * linears  # W^T of each Linear, in bf16
    assert bf16.layer("embed").cast_weight_bytes == 0  # autocast leaves embeddings alone
    assert Profile.from_json(bf16.to_json()) == bf16


def test_measure_needs_an_autocast_device() -> None:
    with pytest.raises(UserError, match=r"'meta' has not.*--estimate"):
        autocast_region(torch.device("meta"), "bf16")


# ---- estimated at the precision's peak --------------------------------------------------------


def test_peaks_per_precision() -> None:
    a100, v100, cpu = DEVICE_MODELS["a100"], DEVICE_MODELS["v100"], DEVICE_MODELS["cpu"]
    assert peak_flops(a100, "bf16") == peak_flops(a100, "fp16") == 16 * peak_flops(a100, "fp32")  # 312 / 19.5
    assert peak_flops(v100, "fp16") == 8 * peak_flops(v100, "bf16") == 8 * peak_flops(v100, "fp32")  # no bf16 units
    assert peak_flops(cpu, "bf16") == peak_flops(cpu, "fp32")


def test_bf16_estimate_is_faster_by_about_the_ratio_of_the_peaks() -> None:
    fp32, bf16 = gpt1("a100", "fp32"), gpt1("a100", "bf16")
    assert bf16.precision == "bf16" and "at bf16" in bf16.source
    ratio = peak_flops(DEVICE_MODELS["a100"], "bf16") / peak_flops(DEVICE_MODELS["a100"], "fp32")
    block32, block16 = fp32.layer("block0"), bf16.layer("block0")
    # matmuls (most of a block's time) at the peaks' ratio; the memory-bound rest at 2x, and under bf16
    # the casts of the weights (forward: to bf16, backward: their gradients to fp32): 11x and 10x here
    assert 0.65 * ratio < block32.forward_s[0] / block16.forward_s[0] <= ratio
    assert 0.55 * ratio < block32.backward_s[0] / block16.backward_s[0] <= ratio
    assert block16.output_bytes_per_sample == block32.output_bytes_per_sample // 2
    assert block16.saved_bytes_per_sample < 0.51 * block32.saved_bytes_per_sample
    assert block16.parameter_bytes == block32.parameter_bytes  # float32 master weights
    assert (block32.cast_weight_bytes, block16.cast_weight_bytes) == (0, 2 * 12 * 768**2)  # the block's matmuls
    assert bf16.loss_saved_bytes_per_sample == fp32.loss_saved_bytes_per_sample  # losses run in float32



def test_a_model_autocast_cannot_run_is_a_user_error_that_says_what_to_do() -> None:
    error = unsupported("gpt-tiny", "fp16", torch.device("cpu"), RuntimeError("no Half kernel"))
    assert str(error) == ("'gpt-tiny' cannot run under fp16 autocast on cpu (no Half kernel); profile at bf16 on "
                          "the CPU (`--precision bf16`), or at fp16 on a CUDA device")
