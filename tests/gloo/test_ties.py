"""Tied weights across stages (issue 26 §3, docs/architecture.md §6), level (c) like ``test_equivalence``.

:class:`~tests.gloo.models.TiedLM` (embedding and head tied as GPT-2's, blocks 0 and 1 tied as
ALBERT's), a plain ``nn.Module`` captured by fx, trains 3 steps under gpipe, 1f1b, zb1, interleaved,
zbv, graph (the DAG kernel), replicated stages and clipping, with each tie on one stage, on two
stages of two ranks, or on two stages of one rank; every rank's copy of every weight equals the
module itself trained by plain torch within 1e-5, and the weights each rank holds are the memory
model's. A checkpointed run resumes bit for bit, writes
each tie once and exports weights that the original module loads with ``strict=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import loss_sum
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint, newest_checkpoint
from pipetrain.runtime.job.data import make_batch
from pipetrain.simulate.memory import stage_memory

from .models import TiedLM, cut, graph_plan, tied_lm_graph, v_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 8
TOL = 1e-5
GRAPH = tied_lm_graph()
SGD = TrainConfig(steps=3, lr=0.5, progress=False, timeout_s=30)
ADAM = TrainConfig(steps=3, optimizer="adam", lr=1e-2, progress=False, timeout_s=30)
CLIP = TrainConfig(steps=3, lr=0.5, clip_grad_norm=0.05, progress=False, timeout_s=30)
BLOCKS_IN_ONE = [("wte", "blocks.0", "blocks.1"), ("blocks.2", "lm_head")]  # the blocks' tie inside stage 0


def plan(stages: Sequence[Sequence[str]], ranks: Sequence[Sequence[int]], method: Method, n_micro: int = 4) -> Plan:
    sizes = equal_sizes(BATCH, n_micro)
    return Plan("tied-test", "", BATCH, method,
                tuple(StagePlan(tuple(s), tuple(r), sizes, sizes) for s, r in zip(stages, ranks, strict=True)))


CASES: dict[str, tuple[Plan, TrainConfig]] = {
    "1f1b": (plan(BLOCKS_IN_ONE, [(0,), (1,)], Method.ONE_F_ONE_B), SGD),
    "gpipe-both-across": (plan(cut(GRAPH.names, 2), [(0,), (1,)], Method.GPIPE, 3), SGD),
    "zb1-adam": (plan(BLOCKS_IN_ONE, [(0,), (1,)], Method.ZB1), ADAM),
    # 4 stages on 2 ranks: embedding on stage 0 (rank 0), head on stage 3 (rank 1), blocks on ranks 1 and 0
    "interleaved": (plan(cut(GRAPH.names, 4), [(0,), (1,), (0,), (1,)], Method.INTERLEAVED), SGD),
    # a V: embedding and head on stages 0 and 3 of rank 0, the blocks on stages 1 and 2 of rank 1
    "zbv": (v_plan(GRAPH, BATCH, 2, 4), SGD),
    "replicated": (plan(BLOCKS_IN_ONE, [(0, 1), (2,)], Method.ONE_F_ONE_B), SGD),
    "graph": (graph_plan(GRAPH, BLOCKS_IN_ONE, [(0,), (1,)], [(2, 2, 4), (4, 4)]), SGD),
    "1f1b-clip": (plan(BLOCKS_IN_ONE, [(0,), (1,)], Method.ONE_F_ONE_B), CLIP),
}


def torch_train(config: TrainConfig, steps: int | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The module itself (``GRAPH.build_module()``, its ties intact) trained by plain torch on the same
    batches: its ``state_dict`` (a tie under each name) and losses."""
    module = GRAPH.build_module()
    optimizer = config.build_optimizer(module.parameters())
    losses = []
    for step in range(config.steps if steps is None else steps):
        x, y = make_batch(GRAPH, BATCH, step, config.seed, config.data)
        loss = loss_sum(GRAPH.loss, module(x), y) / BATCH
        loss.backward()
        if config.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), config.clip_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {k: v.detach() for k, v in module.state_dict().items()}, losses


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, p, config, return_state_dict=True) for p, config in CASES.values()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_every_copy_equals_plain_torch(results: dict[str, TrainResult], name: str) -> None:
    expected, losses = torch_train(CASES[name][1])
    got = results[name].state_dict
    assert set(got) == set(expected)  # both names of each tie, as the module's state_dict
    assert got["lm_head.weight"] is got["wte.weight"] and got["blocks.1.weight"] is got["blocks.0.weight"]
    for key, value in expected.items():
        assert torch.allclose(got[key], value, rtol=0, atol=TOL), key
    assert results[name].losses == pytest.approx(losses, abs=TOL)
    assert (got["wte.weight"] - GRAPH.build_module().wte.weight).abs().max() > 1e-3  # it trained


@pytest.mark.parametrize("name", ["1f1b", "gpipe-both-across", "zb1-adam"])
def test_measured_weights_and_gradients_equal_the_memory_model(results: dict[str, TrainResult], name: str) -> None:
    """Each stage holds a copy of a tie it shares with another stage, and one of a tie inside it."""
    stages_plan, config = CASES[name]
    cost = CostModel(estimate_profile(GRAPH, "a100", BATCH), Cluster.local(2))
    predicted = stage_memory(stages_plan, cost, optimizer=config.optimizer)
    measured = sorted(results[name].memory, key=lambda m: m.rank)
    assert [m.weight_bytes for m in measured] == [p.weight_bytes for p in predicted]
    assert [m.gradient_bytes for m in measured] == [p.gradient_bytes for p in predicted]


def test_clipping_was_active() -> None:
    """Guards the clip case: the plain run with clipping differs from the one without."""
    clipped, _ = torch_train(CLIP)
    plain, _ = torch_train(SGD)
    assert (clipped["wte.weight"] - plain["wte.weight"]).abs().max() > 1e-3


def test_checkpoint_writes_a_tie_once_resumes_and_exports(tmp_path: Path) -> None:
    tied = plan(cut(GRAPH.names, 2), [(0,), (1,)], Method.ONE_F_ONE_B)

    def config(name: str, steps: int, resume: Path | None = None) -> TrainConfig:
        return TrainConfig(steps=steps, optimizer="adam", lr=1e-2, progress=False, timeout_s=60,
                           checkpoint_dir=tmp_path / name, checkpoint_every=2, resume=resume)

    unbroken, _ = train_many([TrainJob(GRAPH, tied, config("whole", 4), return_state_dict=True),
                              TrainJob(GRAPH, tied, config("first", 2))])
    (resumed,) = train_many([TrainJob(GRAPH, tied, config("second", 4, tmp_path / "first"), return_state_dict=True)])
    for name, value in unbroken.state_dict.items():
        assert torch.equal(value, resumed.state_dict[name]), name

    checkpoint = newest_checkpoint(tmp_path / "whole")
    assert checkpoint is not None
    written = [k for shard in checkpoint.shards for k in shard.keys]
    assert written.count("wte.weight") == 1 and written.count("blocks.0.weight") == 1
    assert "lm_head.weight" not in written and "blocks.1.weight" not in written
    out = tmp_path / "model.pt"
    export_checkpoint(tmp_path / "whole", out)
    state = torch.load(out, weights_only=True)
    assert state["lm_head.weight"].data_ptr() == state["wte.weight"].data_ptr()  # saved once
    model = TiedLM()
    model.load_state_dict(state, strict=True)
    assert model.lm_head.weight is model.wte.weight
    assert torch.equal(model.wte.weight, unbroken.state_dict["wte.weight"])
    TiedLM().load_state_dict(unbroken.state_dict, strict=True)  # the Python API's result too
