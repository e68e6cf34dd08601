"""Hugging Face models trained as they are on 2 ranks (issue 26 §1, level (c) like ``test_equivalence``).

GPT-2 (its head tied to its embedding, on different stages), Llama (an attention mask crosses every
cut) and BERT for classification (padding masks), from tiny configs with random init, trained 3
SGD steps under 1f1b, zb1, interleaved and data parallel (the whole model, a tie inside it, replicated
on both ranks): every weight equals the Hugging Face model itself trained in one process with its
own loss (``labels``) on the same batches, under the model's own names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipetrain.api import resolve_model
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.packing import Slot, unpack
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint
from pipetrain.runtime.job.data import make_batch
from tests import hf_models

from .models import chain_plan, cut

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 8
TOL = 1e-5
MODELS = {
    "gpt2": ("tests.hf_models:gpt2", "tests.hf_models:causal_data"),
    "llama": ("tests.hf_models:llama", "tests.hf_models:causal_masked_data"),
    "bert": ("tests.hf_models:bert", "tests.hf_models:classification_data"),
}
METHODS = ("1f1b", "zb1", "interleaved", "replicated")


def _config(data: str, checkpoints: Path | None = None) -> TrainConfig:
    return TrainConfig(steps=3, lr=0.1, data=data, progress=False, timeout_s=60, checkpoint_dir=checkpoints,
                       checkpoint_every=0)


def _plan(graph: LayerGraph, method: str) -> Plan:
    if method == "interleaved":  # 4 stages looping over 2 ranks
        sizes = equal_sizes(BATCH, 2)
        stages = tuple(StagePlan(layers, (k % 2,), sizes, sizes) for k, layers in enumerate(cut(graph.names, 4)))
        return Plan(graph.name, "", BATCH, Method.INTERLEAVED, stages)
    if method == "replicated":  # one stage on both ranks, a micro-batch each
        sizes = equal_sizes(BATCH, 2)
        return Plan(graph.name, "", BATCH, Method.GPIPE, (StagePlan(graph.names, (0, 1), sizes, sizes),))
    return chain_plan(graph, 2, BATCH, 4, Method.ONE_F_ONE_B if method == "1f1b" else Method.ZB1)


@pytest.fixture(scope="module")
def graphs() -> dict[str, LayerGraph]:
    return {name: resolve_model(model, data=data) for name, (model, data) in MODELS.items()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-checkpoints")


@pytest.fixture(scope="module")
def results(graphs: dict[str, LayerGraph], checkpoints: Path) -> dict[tuple[str, str], TrainResult]:
    cases = [(name, method) for name in MODELS for method in METHODS]
    jobs = [TrainJob(graphs[name], _plan(graphs[name], method),
                     _config(MODELS[name][1], checkpoints / name if method == "1f1b" else None), return_state_dict=True)
            for name, method in cases]
    return dict(zip(cases, train_many(jobs), strict=True))


def _hugging_face_train(name: str, graph: LayerGraph) -> nn.Module:
    """The Hugging Face model itself, trained with its own loss on the pipeline's batches."""
    model = getattr(hf_models, MODELS[name][0].split(":")[1])()
    config = _config(MODELS[name][1])
    optimizer = config.build_optimizer(model.parameters())
    slots = [Slot(f.shape, f.torch_dtype) for f in graph.input.fields]
    for step in range(config.steps):
        x, y = make_batch(graph, BATCH, step, config.seed, config.data)
        inputs = dict(zip((f.name for f in graph.input.fields), unpack(x, slots), strict=True))
        model(**inputs, labels=y).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_weights_equal_the_hugging_face_model_trained_in_one_process(
        graphs: dict[str, LayerGraph], results: dict[tuple[str, str], TrainResult], name: str) -> None:
    model = _hugging_face_train(name, graphs[name])
    expected = model.state_dict()
    start = getattr(hf_models, MODELS[name][0].split(":")[1])().state_dict()
    for method in METHODS:
        trained = results[name, method].state_dict
        assert set(trained) <= set(expected)
        # relative to each tensor's scale; a key bias, whose gradient is zero in exact arithmetic, stays ~0
        worst = max((((trained[k] - expected[k]).abs().max() / (expected[k].abs().max() + 0.1)).item(), k)
                    for k in trained)
        assert worst[0] <= TOL, (method, worst)
        assert max((trained[k] - start[k]).abs().max().item() for k in trained) > 1e-4  # training moved them
    loaded = getattr(hf_models, MODELS[name][0].split(":")[1])()
    loaded.load_state_dict(results[name, "1f1b"].state_dict, strict=True)  # the Python API's result
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in results[name, "1f1b"].state_dict.items())


@pytest.mark.parametrize("name", list(MODELS))
def test_the_exported_checkpoint_loads_strictly_into_the_hugging_face_class(
        results: dict[tuple[str, str], TrainResult], checkpoints: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / "model.pt"
    export_checkpoint(checkpoints / name, out)
    state = torch.load(out, weights_only=True)
    model = getattr(hf_models, MODELS[name][0].split(":")[1])()
    model.load_state_dict(state, strict=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in results[name, "1f1b"].state_dict.items())
    if name == "gpt2":  # the tie written once, still one tensor in the class
        assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
        assert model.lm_head.weight is model.transformer.wte.weight
