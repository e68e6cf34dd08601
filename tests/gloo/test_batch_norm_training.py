"""A BatchNorm CNN through the runtime (issue 26 §4, §5; level c): buffers travel with the weights.

* 2 ranks, 1f1b, one micro-batch (so BatchNorm sees the batch a single process sees): after 3 SGD
  steps ``result.state_dict``, running statistics and batch counts included, equals the original
  module trained in one process on the same batches, and loads into it strictly; evaluation uses
  the running statistics (eval mode) and equals the module's own evaluation.
* Checkpoints hold the buffers: 4 steps + resume to 6 equal 6 unbroken steps bit for bit, and
  ``export`` writes the module's state_dict with them.
* A stage that recomputes its forward in backward updates the running statistics in F only.
* A stage replicated on 2 ranks, one micro-batch each: the parameters equal single-process training
  that normalises each half on its own, and the running statistics are replica 0's (those of the
  first half alone), which every step hands to replica 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from pipetrain.graph.layer_graph import loss_sum
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint
from pipetrain.runtime.job.config import job_loss
from pipetrain.runtime.job.data import make_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_module
from tests.bn_net import build, graph

from .models import chain_plan, replicated_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 16
TOL = 1e-5
GRAPH = graph()
SGD = TrainConfig(steps=3, lr=0.1, data="digits", progress=False, timeout_s=60)
ONE_MICRO = chain_plan(GRAPH, 2, BATCH, 1, Method.ONE_F_ONE_B)
REPLICATED = replicated_plan(GRAPH, [2], BATCH, 2, Method.GPIPE)
RECOMPUTED = uneven_plan(GRAPH, [(8, 8), (8, 8)], [(4, 4, 8), (8, 8)])  # stage 0 re-runs forward on 3 ranges
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")

Halves = Callable[[int], list[slice]]


def _module_train(config: TrainConfig, halves: Halves = lambda b: [slice(0, b)]) -> nn.Module:
    """The original module trained in one process on the pipeline's batches; each step normalises the
    slices ``halves(B)`` of the batch on their own, and only the first updates the running statistics
    (as replica 0 of a replicated stage)."""
    module = build()
    optimizer = config.build_optimizer(module.parameters())
    for step in range(config.steps):
        x, y = make_batch(GRAPH, BATCH, step, config.seed, config.data)
        for k, part in enumerate(halves(BATCH)):
            kept = [(b, b.clone()) for b in module.buffers()]
            (loss_sum(GRAPH.loss, module(x[part]), y[part]) / BATCH).backward()
            for buffer, value in kept if k > 0 else []:
                buffer.copy_(value)
        optimizer.step()
        optimizer.zero_grad()
    return module


def _max_diff(result: TrainResult, module: nn.Module) -> float:
    state = module.state_dict()
    assert list(result.state_dict) == list(state)  # every key, the module's own names, its order
    return max((result.state_dict[k].double() - v.double()).abs().max().item() for k, v in state.items())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the checkpointed runs write."""
    return tmp_path_factory.mktemp("bn")


@pytest.fixture(scope="module")
def results(folder: Path) -> dict[str, TrainResult]:
    checkpointed = replace(SGD, steps=6, checkpoint_dir=folder / "whole", checkpoint_every=2)
    jobs = {
        "one-micro": TrainJob(GRAPH, ONE_MICRO, SGD, return_state_dict=True),
        "replicated": TrainJob(GRAPH, REPLICATED, SGD, return_state_dict=True),
        "recomputed": TrainJob(GRAPH, RECOMPUTED, SGD, return_state_dict=True),
        "whole": TrainJob(GRAPH, ONE_MICRO, checkpointed, return_state_dict=True),
        "first": TrainJob(GRAPH, ONE_MICRO, replace(checkpointed, steps=4, checkpoint_dir=folder / "first")),
    }
    done = dict(zip(jobs, train_many(list(jobs.values())), strict=True))
    resumed = replace(checkpointed, checkpoint_dir=folder / "resumed", resume=folder / "first")
    done["resumed"] = train_many([TrainJob(GRAPH, ONE_MICRO, resumed, return_state_dict=True)])[0]
    return done


def test_one_micro_batch_equals_the_module_buffers_included(results: dict[str, TrainResult]) -> None:
    result, module = results["one-micro"], _module_train(SGD)
    assert _max_diff(result, module) <= TOL
    state = result.state_dict
    norms = ("stem.1", "blocks.0.1", "blocks.1.1", "head.bn")
    assert [int(state[f"{m}.num_batches_tracked"]) for m in norms] == [3] * 4  # the evaluation after step 3 added none
    assert not torch.equal(state["head.bn.running_mean"], torch.zeros(8))  # the statistics moved
    original = build()
    original.load_state_dict(state)  # strict: every parameter and buffer under the module's names
    assert all(torch.equal(original.state_dict()[k], v) for k, v in state.items())


def _evaluates_as_the_module(result: TrainResult) -> None:
    """The pipeline's final evaluation equals the module's own (eval mode: running statistics), with
    the result's state_dict loaded."""
    module = build()
    module.load_state_dict(result.state_dict)
    expected = evaluate_module(module, job_loss(TrainJob(GRAPH, ONE_MICRO, SGD)), eval_dataset(SGD.data, GRAPH), BATCH)
    final = result.final_eval
    assert final is not None and final.eval_loss == pytest.approx(expected.loss, abs=1e-5)
    assert final.eval_accuracy == pytest.approx(expected.accuracy)


def test_evaluation_uses_the_running_statistics(results: dict[str, TrainResult]) -> None:
    _evaluates_as_the_module(results["one-micro"])


def test_a_replicated_stage_keeps_replica_zeros_statistics(results: dict[str, TrainResult]) -> None:
    module = _module_train(SGD, lambda b: [slice(0, b // 2), slice(b // 2, b)])
    assert _max_diff(results["replicated"], module) <= TOL
    both = _module_train(SGD, lambda b: [slice(0, b)])
    assert (results["replicated"].state_dict["head.bn.running_mean"] - both.state_dict()["head.bn.running_mean"]
            ).abs().max().item() > 1e-3  # not the whole batch's statistics
    _evaluates_as_the_module(results["replicated"])  # replica 1 evaluates its micro-batches with replica 0's


def test_a_recomputed_forward_does_not_count_twice(results: dict[str, TrainResult]) -> None:
    assert RECOMPUTED.recomputes(0) and not RECOMPUTED.recomputes(1)
    state = results["recomputed"].state_dict
    counts = {m: int(state[f"{m}.num_batches_tracked"]) for m in ("stem.1", "blocks.0.1", "blocks.1.1", "head.bn")}
    assert counts == {"stem.1": 6, "blocks.0.1": 6, "blocks.1.1": 6, "head.bn": 6}  # 2 forwards a step, 3 steps


def test_resume_and_export_carry_the_buffers(results: dict[str, TrainResult], folder: Path, tmp_path: Path) -> None:
    whole, resumed = results["whole"], results["resumed"]
    assert list(whole.state_dict) == list(resumed.state_dict)
    for name, value in whole.state_dict.items():
        assert torch.equal(value, resumed.state_dict[name]), name
    assert any(name.endswith(BUFFERS) for name in whole.state_dict)
    export_checkpoint(folder / "whole", tmp_path / "model.pt")
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(exported) == list(whole.state_dict)
    assert all(torch.equal(exported[k], v) for k, v in whole.state_dict.items())
    build().load_state_dict(exported)  # strict
