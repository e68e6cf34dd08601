"""Captured nn.Modules through the runtime (issue 12 §1), level (c) like ``test_equivalence``.

After 3 SGD steps on the digits, every rank's parameters equal single-process training of the
layer chain (:func:`reference_train`) and of the user's module itself, on 2 and 3 stages: the
example's residual MLP (one tensor per cut) and a skip network whose cuts carry two packed tensors,
between ranks and between layers of one rank, also re-chunked by unequal micro-batches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from examples.custom_model import build
from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.runtime.interp.rank_setup import stage_specs
from pipetrain.runtime.job.data import make_batch

from .models import chain_plan, max_param_diff, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 16
TOL = 1e-5
SGD = TrainConfig(steps=3, lr=0.1, data="digits", progress=False, timeout_s=30)


class SkipNet(nn.Module):
    """``h = stem(x)`` skips ``a`` and ``b``: the cut between them carries ``h`` and ``a``'s output."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a = nn.Linear(64, 32), nn.Linear(32, 24)
        self.b, self.head = nn.Linear(24, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(h + self.b(torch.tanh(self.a(h))))


def _digits_graph(module: nn.Module, name: str) -> LayerGraph:
    return capture(module, input=TensorSpec((64,)), target=TensorSpec((), "int64", high=10),
                   loss=LossKind.CROSS_ENTROPY, name=name)


def _module_train(graph: LayerGraph, config: TrainConfig) -> dict[str, torch.Tensor]:
    """The user's module itself (``graph.build_module()``), trained on the same batches."""
    module = graph.build_module()
    optimizer = config.build_optimizer(module.parameters())
    for step in range(config.steps):
        x, y = make_batch(graph, BATCH, step, config.seed, config.data)
        (loss_sum(graph.loss, module(x), y) / BATCH).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach() for name, p in module.named_parameters()}


torch.manual_seed(0)
RESIDUAL = _digits_graph(build(), "residual-mlp")
SKIP = _digits_graph(SkipNet(), "skip")
CASES = {
    "residual-2stages": chain_plan(RESIDUAL, 2, BATCH, 4),
    "residual-3stages-1f1b": chain_plan(RESIDUAL, 3, BATCH, 3, Method.ONE_F_ONE_B),
    "skip-2stages-packed-between-ranks": chain_plan(SKIP, 2, BATCH, 4),
    "skip-3stages-packed-inside-a-stage": chain_plan(SKIP, 3, BATCH, 2, Method.ONE_F_ONE_B),
    "skip-rechunked": uneven_plan(SKIP, [(5, 5, 6), (3, 13)]),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    graphs = [RESIDUAL if name.startswith("residual") else SKIP for name in CASES]
    jobs = [TrainJob(g, plan, SGD, return_state_dict=True) for g, plan in zip(graphs, CASES.values(), strict=True)]
    return dict(zip(CASES, train_many(jobs), strict=True))


def test_the_skip_cut_between_ranks_carries_two_tensors() -> None:
    assert SKIP.names == ("stem", "a", "b", "head")
    assert CASES["skip-2stages-packed-between-ranks"].stages[0].layers == ("stem", "a")
    assert not SKIP.is_chain and SKIP.output_specs()[1] == TensorSpec((24,))  # a DAG: b reads stem and a
    assert stage_specs(SKIP, [0, 1])[1] == TensorSpec((32 + 24,))  # the linearised cut carries both


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_single_process_training(results: dict[str, TrainResult], name: str) -> None:
    graph = RESIDUAL if name.startswith("residual") else SKIP
    result = results[name]
    reference = reference_train(graph, BATCH, SGD)
    assert max_param_diff(result, reference) <= TOL
    assert result.losses == pytest.approx(reference.losses, abs=TOL)
    module = _module_train(graph, SGD)
    assert set(module) == set(result.state_dict)  # the module's own names
    assert max((module[k] - result.state_dict[k]).abs().max().item() for k in module) <= TOL
    start = dict(graph.build_module().named_parameters())
    assert max((module[k] - start[k]).abs().max().item() for k in module) > 1e-3  # training moved them
