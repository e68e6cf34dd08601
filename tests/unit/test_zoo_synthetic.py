"""The synthetic zoo family: seeded, reproducible, trainable, and with diverse cost curves."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch

from pipetrain.cluster import DEVICE_MODELS
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LossKind, TensorSpec, loss_sum
from pipetrain.graph.zoo import build_model
from pipetrain.graph.zoo.synthetic import KINDS, SyntheticConfig, draw_layers
from pipetrain.profile.estimate import estimate_profile


def kind(layer_name: str) -> str:
    return layer_name.rstrip("0123456789")


def test_same_variant_same_network_and_different_variants_differ() -> None:
    a, b = build_model("synthetic", variant=5), build_model("synthetic", variant=5)
    assert a.names == b.names
    assert a.fingerprint() == b.fingerprint()
    fingerprints = {build_model("synthetic", variant=v).fingerprint() for v in range(10)}
    assert len(fingerprints) == 10
    assert build_model("synthetic").names != build_model("synthetic", variant=1).names


def test_preset_is_variant_0_and_names_show_kinds_and_positions() -> None:
    graph = build_model("synthetic")
    assert graph.fingerprint() == build_model("synthetic", variant=0).fingerprint()
    assert graph.names == ("flat0", "overhead1", "wide2", "overhead3", "wide4", "wide5", "flat6", "flat7")
    assert graph.input == TensorSpec((256,))
    assert graph.target == TensorSpec((), "int64", high=10)
    assert graph.loss is LossKind.CROSS_ENTROPY
    specs = graph.output_specs()
    assert all(s.shape == (256,) for s in specs[:-1])  # any contiguous cut is a valid stage
    assert specs[-1].shape == (10,)


def test_synthetic_k_names_variant_k() -> None:
    named = build_model("synthetic-3")
    assert named.name == "synthetic-3"
    assert named.names == build_model("synthetic", variant=3).names
    assert len(build_model("synthetic-0", n_layers=4)) == 4
    with pytest.raises(UserError, match="already names its variant"):
        build_model("synthetic-3", variant=4)
    with pytest.raises(UserError, match="unknown model 'synthetic-03'"):
        build_model("synthetic-03")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"variant": -1}, "variant must be a non-negative integer"),
        ({"variant": 1.5}, "variant must be a non-negative integer"),
        ({"n_layers": 0}, "n_layers must be a positive integer"),
        ({"width": 0.0}, "width must be a positive number"),
    ],
)
def test_bad_settings_are_user_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_model("synthetic", **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize("n_layers", [1, 2, 3, 5, 8, 13])
def test_kinds_are_balanced(n_layers: int) -> None:
    for variant in range(5):
        kinds = [d.kind for d in draw_layers(SyntheticConfig(variant=variant, n_layers=n_layers))]
        counts = [kinds.count(k) for k in KINDS]
        assert max(counts) - min(counts) <= 1, kinds


def test_width_scales_the_hidden_sizes_only() -> None:
    full = draw_layers(SyntheticConfig(variant=2))
    thin = draw_layers(SyntheticConfig(variant=2, width=0.125))
    assert [d.kind for d in thin] == [d.kind for d in full]
    for a, b in zip(full, thin, strict=True):
        if a.kind == "overhead":
            assert b == a
        else:
            assert b.tokens == a.tokens
            assert b.hidden == pytest.approx(a.hidden * 0.125, abs=1)


def test_pickles_and_rebuilds_the_same_weights() -> None:
    graph = build_model("synthetic", variant=4, seed=3, width=0.125)
    copy = pickle.loads(pickle.dumps(graph))
    for i in range(len(graph)):
        a, b = graph.build_layer(i).state_dict(), copy.build_layer(i).state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_forward_backward_and_training_reduce_the_loss() -> None:
    graph = build_model("synthetic", variant=1)
    model = graph.build_sequential()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=generator)
    y = torch.randint(0, 10, (16,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        loss = loss_sum(graph.loss, model(x), y) / len(y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert losses[-1] < 0.8 * losses[0]


V100 = dataclasses.replace(DEVICE_MODELS["v100"], fp32_peak_flops=None, host_dispatch_s=0.0,
                           host_bandwidth_bytes_per_s=None)
"""The roofline the variants were designed on (pipetrain.graph.zoo.synthetic): float32 bytes at the
V100's tensor-core peak, without the host's dispatch and copies."""


def test_ten_variants_have_strongly_different_cost_curves_on_v100() -> None:
    """Per-sample efficiency 64·t(1)/t(64) of the estimated forward differs ≥ 4× inside every
    network: wide layers slow down with b, flat and overhead layers barely do."""
    for variant in range(10):
        graph = build_model("synthetic", variant=variant)
        profile = estimate_profile(graph, V100, batch_size=64, sizes=(1, 64))
        growth = {layer.name: layer.forward_s[1] / layer.forward_s[0] for layer in profile.layers[:-1]}  # no loss
        efficiency = [64 / g for g in growth.values()]
        assert max(efficiency) / min(efficiency) >= 4, (variant, growth)
        for name, g in growth.items():
            if kind(name) == "wide":
                assert g > 3, (variant, name, g)  # activation-bound from a few samples on
            else:
                assert g < 1.5, (variant, name, g)  # launch- or weight-bound up to b = 64
        backward = [layer.backward_s[1] / layer.backward_s[0] for layer in profile.layers]
        assert max(backward) / min(backward) >= 3, variant


def test_overhead_layers_have_the_largest_fixed_cost_and_flat_layers_turn_late() -> None:
    graph = build_model("synthetic", variant=0)
    profile = estimate_profile(graph, V100, batch_size=1024, sizes=(1, 64, 1024))
    by_kind: dict[str, list[tuple[float, ...]]] = {k: [] for k in KINDS}
    for layer in profile.layers[:-1]:  # the last layer also carries the head
        by_kind[kind(layer.name)].append(layer.forward_s)
    # α: one sample costs more in every overhead layer than in any other layer.
    assert min(t[0] for t in by_kind["overhead"]) > 2 * max(
        t[0] for k in ("wide", "flat") for t in by_kind[k]
    )
    # Flat layers are weight-bound to b ≈ 2P/W = 200, then grow; overhead layers stay flat.
    assert all(t[1] < 1.3 * t[0] and t[2] > 2 * t[1] for t in by_kind["flat"])
    assert all(t[2] < 1.5 * t[0] for t in by_kind["overhead"])
