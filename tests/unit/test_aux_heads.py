"""Auxiliary heads of local learning: built from the stage's output spec, predicting the model's output
(classes, regression values, tokens), deterministic, the task's loss as a mean."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_KINDS, build_aux_head, check_aux, default_aux
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime import TrainConfig, TrainJob
from pipetrain.runtime.job.checks import check_job

MODELS = ["mlp-digits", "cnn-digits", "resnet-digits", "vit-digits"]


@pytest.mark.parametrize("kind", AUX_KINDS)
@pytest.mark.parametrize("name", MODELS)
def test_every_head_gives_a_mean_loss_on_every_cut(name: str, kind: str) -> None:
    graph = build_model(name)
    specs = graph.output_specs()
    x, y = torch.randn(3, *graph.input.shape), torch.tensor([0, 3, 9])
    for stage, spec in enumerate(specs[:-1]):
        head = build_aux_head(check_aux(graph, kind), graph, spec, stage, len(specs))
        loss = head(torch.randn(3, *spec.shape), y, x, partial(loss_sum, LossKind.CROSS_ENTROPY))
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


def regression(outputs: tuple[int, ...]) -> LayerGraph:
    """Two linear layers from 5 features to float targets ``outputs`` per sample, scored by MSE."""
    n = outputs[0] if outputs else 1
    layers = [("hidden", nn.Sequential(nn.Linear(5, 8), nn.ReLU())), ("out", nn.Linear(8, n))]
    if not outputs:
        layers.append(("squeeze", nn.Flatten(0)))
    return LayerGraph.from_layers(layers, input=TensorSpec((5,)), target=TensorSpec(outputs), loss=LossKind.MSE)


@pytest.mark.parametrize("kind", AUX_KINDS)
@pytest.mark.parametrize("outputs", [(3,), ()])
def test_regression_heads_predict_the_targets_shape_and_score_them_with_the_task_loss(
        kind: str, outputs: tuple[int, ...]) -> None:
    graph = regression(outputs)
    spec = graph.output_specs()[0]
    head = build_aux_head(check_aux(graph, kind), graph, spec, 0, 2)
    h, y = torch.randn(4, *spec.shape), torch.randn(4, *outputs)
    assert head.predictor(h).shape == (4, *outputs)
    mse = head(h, y, torch.randn(4, 5), partial(loss_sum, LossKind.MSE))
    assert torch.allclose(mse, nn.functional.mse_loss(head.predictor(h), y))
    l1 = head(h, y, torch.randn(4, 5), lambda out, target: (out - target).abs().sum())  # a user's loss
    assert torch.allclose(l1, (head.predictor(h) - y).abs().sum() / 4)


@pytest.mark.parametrize("loss", [LossKind.LM, LossKind.CAUSAL_LM])  # cross-entropy per position, next-token
@pytest.mark.parametrize("kind", AUX_KINDS)
def test_language_model_heads_predict_every_position(kind: str, loss: LossKind) -> None:
    graph = build_model("gpt-tiny")
    specs = graph.output_specs()
    head = build_aux_head(check_aux(graph, kind, specs[:-1]), graph, specs[1], 1, len(specs))
    tokens = torch.randint(0, 256, (2, 32))
    logits = head.predictor(torch.randn(2, 32, 64))
    assert logits.shape == (2, 32, 256) and head.decoder is None
    value = head(torch.randn(2, 32, 64), tokens, tokens, partial(loss_sum, loss))
    assert value.shape == () and torch.isfinite(value)


def test_refusals_name_the_fix() -> None:
    with pytest.raises(UserError, match="--aux 'x' is unknown"):
        check_aux(build_model("mlp-digits"), "x")
    images = LayerGraph.from_layers([("conv", nn.Conv2d(1, 2, 3, padding=1)), ("out", nn.Conv2d(2, 2, 1))],
                                    input=TensorSpec((1, 4, 4)), target=TensorSpec((2, 4, 4)), loss=LossKind.MSE)
    with pytest.raises(UserError, match=r"outputs \(2, 4, 4\) float32 per sample; use another method"):
        check_aux(images, "dgl")
    sizes = (2, 2)
    plan = Plan("images", "", 4, Method.LOCAL, (StagePlan(("conv",), (0,), sizes, sizes),
                                               StagePlan(("out",), (1,), sizes, sizes)),
                weights=WeightPolicy.LOCAL, params=LocalParams("dgl"))
    with pytest.raises(UserError, match="use another method"):  # before any rank starts
        check_job(TrainJob(images, plan, TrainConfig(steps=2, data="synthetic")))
    gpt = build_model("gpt-tiny")
    with pytest.raises(UserError, match="from tokens \\[T, D\\] of the same T; a stage here outputs \\(64,\\)"):
        check_aux(gpt, "linear", [TensorSpec((64,))])
