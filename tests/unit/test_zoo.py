"""The model zoo: presets, sizes, shapes, picklable factories, deterministic weights."""

from __future__ import annotations

import pickle

import pytest
import torch

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.graph.zoo import MODEL_NAMES, build_model


def n_params(graph: LayerGraph, indices: range | None = None) -> int:
    chosen = range(len(graph)) if indices is None else indices
    return sum(p.numel() for i in chosen for p in graph.build_layer(i, "meta").parameters())


def test_presets_are_listed() -> None:
    assert MODEL_NAMES == (
        "mlp", "mlp-digits", "cnn-digits", "resnet-digits", "vit-digits",
        "gpt-tiny", "gpt1-14", "vgg16", "vgg16-32", "resnet50", "resnet50-32", "gnmt",
        "gnmt-tiny", "synthetic", "mmt", "mmt-tiny", "candle-uno", "candle-uno-tiny", "dlrm",
        "dlrm-tiny", "branchy-digits",
    )


@pytest.mark.parametrize(
    ("name", "n_layers"),
    [
        ("mlp", 8),
        ("mlp-digits", 4),
        ("gpt-tiny", 6),
        ("gpt1-14", 14),
        ("vgg16", 16),
        ("vgg16-32", 16),
        ("synthetic", 8),
    ],
)
def test_layer_counts_and_names(name: str, n_layers: int) -> None:
    graph = build_model(name)
    assert len(graph) == n_layers
    assert graph.name == name


def test_gpt1_sizes_match_the_paper() -> None:
    graph = build_model("gpt1-14")
    assert graph.names == ("embed", *(f"block{i}" for i in range(12)), "head")
    # GPT-1's "117M" is the model without a separate head (its head was the tied embedding).
    assert n_params(graph, range(13)) == 116_534_784
    head = 40478 * 768 + 2 * 768  # untied Linear(768 → 40478, no bias) + final LayerNorm
    assert n_params(graph) == 116_534_784 + head == 147_623_424
    assert graph.input == TensorSpec((512,), "int64", high=40478)
    assert graph.target == graph.input
    assert graph.loss is LossKind.LM
    specs = graph.output_specs()
    assert specs[0].shape == specs[12].shape == (512, 768)
    assert specs[-1].shape == (512, 40478)


def test_vgg16_sizes_match_the_paper() -> None:
    graph = build_model("vgg16")
    assert n_params(graph) == 138_357_544  # Simonyan & Zisserman, configuration D
    specs = graph.output_specs()
    assert specs[1].shape == (64, 112, 112)  # conv1_2 carries the first max-pool
    assert specs[12].shape == (512, 7, 7)
    assert [s.shape for s in specs[13:]] == [(4096,), (4096,), (1000,)]
    assert graph.names[:3] == ("conv1_1", "conv1_2", "conv2_1")
    assert graph.input.shape == (3, 224, 224)


def test_vgg16_32_and_width_multiplier() -> None:
    graph = build_model("vgg16-32")
    assert graph.output_specs()[-1].shape == (10,)
    assert graph.output_specs()[13].shape == (512,)
    thin = build_model("vgg16-32", width=0.125)
    assert thin.output_specs()[0].shape == (8, 32, 32)
    assert thin.output_specs()[13].shape == (64,)


def test_mlp_preset_shapes() -> None:
    graph = build_model("mlp")
    assert all(s.shape == (1024,) for s in graph.output_specs())
    assert n_params(graph) == 8 * (1024 * 4096 + 4096 + 4096 * 1024 + 1024)
    assert graph.target == TensorSpec((), "int64", high=1024)
    digits = build_model("mlp-digits")
    assert digits.input.shape == (64,)
    assert digits.output_specs()[-1].shape == (10,)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_factories_pickle_and_rebuild_the_same_weights(name: str) -> None:
    graph = build_model(name, seed=3)
    for layer in graph.layers:
        pickle.dumps(layer.build)
    copy = pickle.loads(pickle.dumps(graph))
    last = len(graph) - 1  # the meta device keeps this cheap even for gpt1-14
    assert [p.shape for p in copy.build_layer(last, "meta").parameters()] == [
        p.shape for p in graph.build_layer(last, "meta").parameters()
    ]


@pytest.mark.parametrize("name", ["mlp-digits", "gpt-tiny"])
def test_build_layer_is_deterministic(name: str) -> None:
    graph = build_model(name, seed=7)
    copy = pickle.loads(pickle.dumps(graph))
    for i in range(len(graph)):
        a, b = graph.build_layer(i).state_dict(), copy.build_layer(i).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    other = build_model(name, seed=8).build_layer(1).state_dict()
    assert not all(torch.equal(v, other[k]) for k, v in graph.build_layer(1).state_dict().items())


def test_gpt_tiny_trains_and_is_causal() -> None:
    graph = build_model("gpt-tiny")
    model = graph.build_sequential()
    tokens = torch.randint(0, 256, (3, 32))
    logits = model(tokens)
    assert logits.shape == (3, 32, 256)
    loss = loss_sum(graph.loss, logits, torch.randint(0, 256, (3, 32)))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(changed)[:, :20], logits[:, :20])


def test_thin_vgg_runs_forward() -> None:
    graph = build_model("vgg16-32", width=0.0625)
    out = graph.build_sequential()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_overrides_change_sizes() -> None:
    graph = build_model("gpt-tiny", blocks=2, hidden=32, heads=2)
    assert len(graph) == 4
    assert graph.output_specs()[1].shape == (32, 32)
    assert len(build_model("mlp", n_layers=3, width=16, hidden=32, inputs=16)) == 3


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"unknown model 'gpt2'.*gpt-tiny.*vgg16-32"):
        build_model("gpt2")


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("gpt-tiny", {"layers": 3}, "no setting 'layers'.*blocks"),
        ("gpt-tiny", {"blocks": 0}, "blocks must be a positive integer"),
        ("gpt-tiny", {"hidden": 1.5}, "hidden must be a positive integer"),
        ("gpt-tiny", {"heads": True}, "heads must be a positive integer"),
        ("gpt-tiny", {"heads": "4"}, "heads must be a positive integer"),
        ("vgg16", {"width": -0.5}, "width must be a positive number"),
        ("gpt-tiny", {"hidden": 66}, "not divisible by heads"),
        ("vgg16", {"image": 100}, "multiple of 32"),
    ],
)
def test_bad_overrides_are_user_errors(name: str, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_model(name, **overrides)  # type: ignore[arg-type]
