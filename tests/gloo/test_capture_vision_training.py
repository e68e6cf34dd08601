"""Vision models captured at their blocks train under 1f1b on 2 ranks as plain torch does
(issue 26 §2; level c like ``test_capture_training``).

A ViT (``encoder.layers`` split one block per layer, the class token and position embedding with
``conv_proj``) and a MobileNet-V2 (Sequentials of Sequentials ending in ``ReLU6(inplace=True)``,
BatchNorm) from ``tests/vision_models.py``, 3 SGD steps on synthetic images. The reference is the
module itself, running the same micro-batches one after another and summing their gradients: the
BatchNorm statistics are then those of the same micro-batches as in the pipeline.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.data import make_batch
from tests.vision_models import CLASSES, IMAGE, MobileNetV2Like, ViTLike

from .models import chain_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH, MICRO = 8, 4
TOL = 1e-5
SGD = TrainConfig(steps=3, lr=0.1, data="synthetic", progress=False, timeout_s=60)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return ViTLike() if kind == "vit" else MobileNetV2Like(dropout=0.0)


def _graph(model: nn.Module, name: str) -> LayerGraph:
    return capture(model, input=TensorSpec(IMAGE), target=TensorSpec((), "int64", high=CLASSES),
                   loss=LossKind.CROSS_ENTROPY, name=name)


def _plain_train(model: nn.Module, graph: LayerGraph, config: TrainConfig) -> dict[str, torch.Tensor]:
    """``model`` trained on the pipeline's batches, each as ``MICRO`` micro-batches in turn."""
    model = copy.deepcopy(model)
    optimizer = config.build_optimizer(model.parameters())
    for step in range(config.steps):
        x, y = make_batch(graph, BATCH, step, config.seed, config.data)
        for xs, ys in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True):
            (loss_sum(graph.loss, model(xs), ys) / BATCH).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: value.detach() for name, value in model.state_dict().items()}  # BatchNorm statistics too


MODELS = {kind: _model(kind) for kind in ("vit", "mobilenet")}
GRAPHS = {kind: _graph(model, kind) for kind, model in MODELS.items()}
PLANS: dict[str, Plan] = {kind: chain_plan(graph, 2, BATCH, MICRO, Method.ONE_F_ONE_B)
                          for kind, graph in GRAPHS.items()}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPHS[kind], PLANS[kind], SGD, return_state_dict=True) for kind in PLANS]
    return dict(zip(PLANS, train_many(jobs), strict=True))


def test_stages_cut_between_blocks() -> None:
    assert [s.layers for s in PLANS["vit"].stages] == [
        ("conv_proj", "encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"),
        ("encoder.layers.encoder_layer_2", "encoder.ln", "heads.head")]
    assert PLANS["mobilenet"].stages[1].layers[0] == "features.3"


@pytest.mark.parametrize("kind", list(PLANS))
def test_parameters_equal_the_module_trained_on_the_same_micro_batches(
        results: dict[str, TrainResult], kind: str) -> None:
    result = results[kind]
    plain = _plain_train(MODELS[kind], GRAPHS[kind], SGD)
    assert set(result.state_dict) == set(plain)  # the module's own names, buffers included
    assert max((plain[k] - result.state_dict[k]).abs().max().item() for k in plain) <= TOL
    start = dict(MODELS[kind].named_parameters())
    assert max((plain[k] - start[k]).abs().max().item() for k in start) > 1e-3  # training moved them
