"""Auxiliary heads of local learning: built from the stage's output spec, deterministic, a mean loss."""

from __future__ import annotations

import pytest
import torch

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_KINDS, build_aux_head, check_aux, default_aux
from pipetrain.graph.zoo import build_model

MODELS = ["mlp-digits", "cnn-digits", "resnet-digits", "vit-digits"]


@pytest.mark.parametrize("kind", AUX_KINDS)
@pytest.mark.parametrize("name", MODELS)
def test_every_head_gives_a_mean_loss_on_every_cut(name: str, kind: str) -> None:
    graph = build_model(name)
    specs = graph.output_specs()
    x, y = torch.randn(3, *graph.input.shape), torch.tensor([0, 3, 9])
    for stage, spec in enumerate(specs[:-1]):
        head = build_aux_head(check_aux(graph, kind), graph, spec, stage, len(specs))
        loss = head(torch.randn(3, *spec.shape), y, x)
        assert loss.shape == () and torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is not None for p in head.parameters())


def test_infopro_reconstructs_only_image_inputs_from_spatial_outputs() -> None:
    def has_decoder(name: str, stage: int) -> bool:
        graph = build_model(name)
        return build_aux_head("infopro", graph, graph.output_specs()[stage], stage, 4).decoder is not None

    assert has_decoder("cnn-digits", 0) and has_decoder("resnet-digits", 2)
    assert has_decoder("vit-digits", 1)  # 16 tokens as a 4×4 grid
    assert not has_decoder("mlp-digits", 0)  # the input is not an image


def test_defaults_per_model_type() -> None:
    assert default_aux(build_model("mlp-digits")) == "linear"
    assert default_aux(build_model("cnn-digits")) == default_aux(build_model("vit-digits")) == "dgl"


def test_heads_are_deterministic_per_stage_and_reconstruction_weight_falls() -> None:
    graph = build_model("cnn-digits")
    spec = graph.output_specs()[0]
    a, b = (build_aux_head("infopro", graph, spec, 0, 5) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    other = build_aux_head("infopro", graph, spec, 1, 5)
    assert not torch.equal(next(a.parameters()), next(other.parameters()))
    weights = [build_aux_head("infopro", graph, spec, k, 5).reconstruction_weight for k in range(4)]
    assert weights[0] == pytest.approx(1.0) and weights == sorted(weights, reverse=True)


def test_local_learning_needs_one_class_per_sample() -> None:
    with pytest.raises(UserError, match="one class per sample"):
        check_aux(build_model("gpt-tiny"), "linear")
    with pytest.raises(UserError, match="--aux 'x' is unknown"):
        check_aux(build_model("mlp-digits"), "x")
