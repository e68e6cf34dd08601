"""Measured profiles: grid, FLOP and byte counts, timings, thread handling, JSON."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.graph.zoo import build_model
from pipetrain.profile.composition import _composition_ratios, _scaled
from pipetrain.profile.inputs import model_loss_fn, sample_input, size_grid
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.per_layer import _measure_layer
from pipetrain.profile.stats import layer_stats
from pipetrain.profile.table import Profile
from pipetrain.profile.timing import _Timer

FAST = {"warmup": 0, "repeats": 1}


def small_mlp() -> LayerGraph:
    return build_model("mlp", n_layers=2, inputs=32, width=64, hidden=256, classes=10)


def test_default_grid_is_powers_of_two_and_the_batch() -> None:
    assert size_grid(1) == (1,)
    assert size_grid(8) == (1, 2, 4, 8)
    assert size_grid(12) == (1, 2, 4, 8, 12)
    assert size_grid(12, [8, 3, 8]) == (3, 8)


@pytest.mark.parametrize(("batch", "sizes"), [(0, None), (4, []), (4, [2, 0])])
def test_bad_grids_are_user_errors(batch: int, sizes: list[int] | None) -> None:
    with pytest.raises(UserError):
        size_grid(batch, sizes)


def test_linear_flops_and_bytes() -> None:
    layer = nn.Linear(1024, 4096)
    stats, out = layer_stats(layer, torch.randn(8, 1024))
    assert stats.flops_per_sample == 2 * 1024 * 4096
    assert stats.saved_bytes_per_sample == 1024 * 4  # the input; the weight is not per sample
    assert stats.output_bytes_per_sample == 4096 * 4
    assert stats.parameter_bytes == (1024 * 4096 + 4096) * 4
    assert out.requires_grad


def test_held_gradients_are_the_owner_outputs() -> None:
    """What a split backward's B keeps for W: one gradient per parameter owner's output; none without
    parameters; an owner nested in another holds its own gradient besides the outer one's."""
    assert layer_stats(nn.Linear(16, 32), torch.randn(4, 16))[0].held_grad_bytes_per_sample == 32 * 4
    assert layer_stats(nn.ReLU(), torch.randn(4, 16))[0].held_grad_bytes_per_sample == 0
    block = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 8))
    assert layer_stats(block, torch.randn(4, 16))[0].held_grad_bytes_per_sample == (32 + 32 + 8) * 4
    embed = nn.Embedding(10, 6)
    assert layer_stats(embed, torch.randint(0, 10, (4, 5)))[0].held_grad_bytes_per_sample == 5 * 6 * 4


def test_old_profile_json_holds_no_gradients() -> None:
    profile = measure_profile(small_mlp(), 4, sizes=(4,), **FAST)
    assert [lp.held_grad_bytes_per_sample for lp in profile.layers] == [(256 + 64) * 4, (256 + 10) * 4]
    text = profile.to_json().replace('"held_grad_bytes_per_sample"', '"unknown_field"')
    assert all(lp.held_grad_bytes_per_sample == 0 for lp in Profile.from_json(text).layers)


class Square(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x  # autograd saves x twice: one storage


def test_saved_storage_counted_once() -> None:
    stats, _ = layer_stats(Square(), torch.randn(4, 100))
    assert stats.saved_bytes_per_sample == 100 * 4


def test_cpu_attention_flops_are_counted() -> None:
    stats, _ = layer_stats(build_model("gpt-tiny").build_layer(1), torch.randn(2, 32, 64))
    tokens, hidden, heads = 32, 64, 4
    linear = 2 * 12 * hidden * hidden * tokens  # qkv 3H², proj H², MLP 8H² multiply-adds
    attention = 2 * heads * tokens * tokens * 2 * (hidden // heads)  # q kᵀ and p v
    assert stats.flops_per_sample == linear + attention


def test_measured_profile_is_positive_and_grows_with_size() -> None:
    graph = build_model("mlp", n_layers=2, inputs=256, width=256, hidden=1024, classes=10)
    profile = measure_profile(graph, 128, sizes=(1, 128), repeats=3)
    assert profile.model == "mlp" and profile.device == "cpu"
    assert profile.fingerprint == graph.fingerprint()
    assert profile.input_bytes_per_sample == 256 * 4
    for layer in profile.layers:
        assert layer.sizes == (1, 128)
        assert min(layer.forward_s + layer.backward_s) > 0
        assert layer.forward_s[1] > layer.forward_s[0]
        assert layer.backward_s[1] > layer.backward_s[0]
        assert layer.saved_bytes_per_sample > 0
        assert layer.step_s is not None and layer.step_s > 0
        assert set(layer.optimizer_step_s) == {"sgd-momentum", "adam", "adamw"} and layer.clip_s is not None
    assert [lp.output_bytes_per_sample for lp in profile.layers] == [256 * 4, 10 * 4]
    assert profile.layers[0].parameter_bytes == (256 * 1024 * 2 + 1024 + 256) * 4


def test_gpt_tiny_profile_has_a_backward_for_integer_inputs() -> None:
    profile = measure_profile(build_model("gpt-tiny"), 2, **FAST)
    assert profile.layers[0].name == "embed"
    assert profile.layers[0].flops_per_sample == 0
    assert all(b > 0 for lp in profile.layers for b in lp.backward_s)


def test_threads_are_restored_and_reported() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        profile = measure_profile(small_mlp(), 4, threads=1, **FAST)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert profile.source.startswith("measured on cpu, 1 thread, median of 1; layers scaled x")


def test_layers_are_scaled_to_the_whole_models_time() -> None:
    """Per grid size, the layers' forward + backward add up to the whole model's pass (ratio in [0.5, 2])."""
    graph = small_mlp()
    timer = _Timer(torch.device("cpu"), 1, 3)
    layers = measure_profile(graph, 4, **FAST).layers
    ratios = _composition_ratios(graph, layers, timer, model_loss_fn(graph))
    assert len(ratios) == len(layers[0].sizes) and all(0.5 <= r <= 2.0 for r in ratios)
    scaled = _scaled(layers[0], [2.0] * len(ratios))
    assert scaled.forward_s == tuple(2 * v for v in layers[0].forward_s)
    assert scaled.weight_grad_s == tuple(2 * v for v in layers[0].weight_grad_s or ())


def test_json_round_trip(tmp_path: Path) -> None:
    profile = measure_profile(small_mlp(), 4, **FAST)
    assert Profile.from_json(profile.to_json()) == profile
    path = tmp_path / "profile.json"
    profile.save(path)
    assert Profile.load(path) == profile


def test_progress_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    measure_profile(small_mlp(), 2, progress=True, **FAST)
    assert capsys.readouterr().out == ""


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="repeats >= 1"):
        measure_profile(small_mlp(), 4, repeats=0)
    with pytest.raises(UserError, match="high"):
        sample_input(TensorSpec((3,), "int64"), 2, torch.device("cpu"), torch.Generator())


class CountingLinear(nn.Linear):
    """A linear layer that counts its forwards per micro-batch size."""

    def __init__(self) -> None:
        super().__init__(8, 8)
        self.forwards: dict[int, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards[x.shape[0]] = self.forwards.get(x.shape[0], 0) + 1
        return super().forward(x)


def test_the_heap_is_grown_once_per_layer_at_its_largest_size() -> None:
    """Each size is timed with ``warmup + repeats`` forwards, as many whole backwards, as many split
    backwards' B and as many W (each needing a forward, W also its B); the untimed heap-growing pass
    runs once, at the largest size only."""
    module = CountingLinear()
    timer = _Timer(torch.device("cpu"), warmup=1, repeats=2, extra_rounds=0)  # noisy or not, one round
    profile, _ = _measure_layer("counting", module, torch.randn(4, 8), (1, 2, 4), timer, torch.Generator(),
                                lambda _: None)
    runs = 4 * (1 + 2)  # timed forwards, then the forwards behind the timed whole backwards, Bs and Ws
    assert module.forwards == {1: runs, 2: runs, 4: 2 + 2 * runs}  # 2: the stats pass and its held gradients
    assert min(profile.forward_s + profile.backward_s) > 0
    assert profile.input_grad_s is not None and profile.weight_grad_s is not None
    assert min(profile.input_grad_s + profile.weight_grad_s) > 0
