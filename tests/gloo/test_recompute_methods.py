"""Activation checkpointing per stage trains exactly like one process, under every synchronous method.

Issue 28 item 3: each synchronous method runs on 2 ranks with recompute set on some of its stages and
not on the others (:attr:`~pipetrain.plan.plan.StagePlan.recompute`): fused backward (gpipe, 1f1b,
uedp, interleaved), split backward, where the forward re-runs before B and W uses the graph B built
(zb1, zb2, interleaved-zb, zbv with the same-rank hand-off between its recomputing and keeping
stages, dualpipev), and a DAG of stages (graph). All jobs run in one launch; every rank's parameters
equal single-process training (:func:`reference_train`) within 1e-5 after 3 steps, and so do the
losses. A small GPT (layer norms, embeddings: W per parameter owner) checks the split backward's
re-run records what W needs. Two cases train at bf16 (a split backward, a DAG stage), the re-run under
the autocast F ran in, against the reference at bf16 within ``tests/gloo/test_precision.py``'s
tolerance (1.5e-4, justified there; the pipelines' rounding differs from one process's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import METHODS, Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many

from .models import branchy_graph, cut, graph_plan, max_param_diff, mlp_graph, uneven_plan, v_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
TOL = 1e-5
BF16_TOL = 1.5e-4
SGD = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=30)
BF16 = replace(SGD, precision="bf16")
MLP = mlp_graph(n_blocks=7)  # 8 layers: 2 stages, or 4 chunks on 2 ranks
GPT = build_model("gpt-tiny", blocks=2)
BRANCHY = branchy_graph()


def _chain(graph: LayerGraph, method: Method, n_micro: int, chunks: int = 1) -> Plan:
    """``2 · chunks`` stages on 2 ranks (looping: stage ``s`` on rank ``s mod 2``), equal micro-batches."""
    sizes = equal_sizes(BATCH, n_micro)
    stages = tuple(StagePlan(layers, (k % 2,), sizes, sizes) for k, layers in enumerate(cut(graph.names, 2 * chunks)))
    return Plan(graph.name, "", BATCH, method, stages)


def _cases() -> dict[str, tuple[LayerGraph, Plan, Sequence[int]]]:
    """Per case: the model, the plan, and the stages that recompute (each rank keeps some stage's activations)."""
    return {
        "gpipe": (MLP, _chain(MLP, Method.GPIPE, 3), (0,)),
        "1f1b": (MLP, _chain(MLP, Method.ONE_F_ONE_B, 4), (1,)),
        "uedp": (MLP, uneven_plan(MLP, [(5, 5, 2), (3, 6, 3)]), (0,)),
        "interleaved": (MLP, _chain(MLP, Method.INTERLEAVED, 4, chunks=2), (0, 3)),
        "zb1": (MLP, _chain(MLP, Method.ZB1, 4), (0,)),
        "zb2": (MLP, _chain(MLP, Method.ZB2, 4), (1,)),
        "interleaved-zb": (MLP, _chain(MLP, Method.INTERLEAVED_ZB, 4, chunks=2), (1, 2)),
        "zbv": (MLP, v_plan(MLP, BATCH, 2, 4), (0, 2)),  # stages 1 (kept) and 2 (recomputed) meet on rank 1
        "dualpipev": (MLP, v_plan(MLP, BATCH, 2, 4, Method.DUALPIPEV), (1, 3)),
        "graph": (BRANCHY, graph_plan(BRANCHY, [("stem", "a1", "a2"), ("b1", "merge", "head")], [(0,), (1,)],
                                      [(3, 3, 3, 3)] * 2), (1,)),
        "zb1-gpt": (GPT, _chain(GPT, Method.ZB1, 4), (1,)),
        "zb1-bf16": (MLP, _chain(MLP, Method.ZB1, 4), (0,)),
        "graph-bf16": (BRANCHY, graph_plan(BRANCHY, [("stem", "a1", "a2"), ("b1", "merge", "head")], [(0,), (1,)],
                                           [(3, 3, 3, 3)] * 2), (1,)),
    }


CASES = {name: (graph, plan.with_recompute(stages)) for name, (graph, plan, stages) in _cases().items()}


def _config(name: str) -> TrainConfig:
    return BF16 if name.endswith("-bf16") else SGD


def test_every_synchronous_method_is_covered() -> None:
    """Guards the grid: every synchronous method may recompute and has a case; every case mixes
    recomputing and keeping stages."""
    synchronous = {m for m, s in METHODS.items() if s.flush and s.gradients_cross_stages}
    assert all(METHODS[m].recompute for m in synchronous)
    assert synchronous == {plan.method for _, plan in CASES.values()}
    for _, plan in CASES.values():
        plan.validate()
        assert 0 < len(plan.recompute_stages) < plan.n_stages


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(graph, plan, _config(name), return_state_dict=True) for name, (graph, plan) in CASES.items()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    graph, plan = CASES[name]
    config = _config(name)
    tol = BF16_TOL if config.precision == "bf16" else TOL
    reference = reference_train(graph, plan.batch_size, config)
    assert max_param_diff(results[name], reference) <= tol
    assert results[name].losses == pytest.approx(reference.losses, abs=tol)
