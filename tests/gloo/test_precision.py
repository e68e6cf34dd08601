"""bf16 pipelines train like one process under bf16 autocast (issue 28; DESIGN.md §5.9).

Every synchronous method runs 3 steps of a small MLP on 2 ranks at ``precision="bf16"`` (each stage's
forward under CPU autocast, float32 master weights, activations and gradients sent as bfloat16), in
one launch, and is compared with :func:`reference_train` at bf16 on the same batches: one process,
the whole model under autocast, no message and so no cast between stages.

Tolerance. bfloat16 keeps 8 bits of mantissa (a relative rounding step of 2**-8 ≈ 0.4%), and the two
runs round at different points. The pipeline rounds each stage's output and input gradient to
bfloat16 when it sends them, where the reference keeps the float32 result of a float32 op (a GPT's
residual stream, ``x + attn(x)``, is float32 under autocast); and it computes each weight gradient per
micro-batch, every bf16 matmul rounded on its own, where the reference rounds one matmul over the
whole batch. Each step's update (lr 0.05 times gradients of about 0.1) then differs by a few bf16
rounding steps, ~1e-5 per step. (With one stage and one micro-batch the pipeline equals the reference
bit for bit, case ``one-stage``: the autocast is the same.) Measured on this machine after 3 steps, the largest
parameter difference: 3.7e-5 for the 8 MLP methods and graph, 3.1e-5 for uedp and for the digits MLP
(whose evaluation, forward-only programs under autocast, differs by 1.5e-5), 6.0e-5 for the GPT, whose
residual stream crosses the stage boundary in bf16 (2 stages of one micro-batch alone give 6.4e-5);
training losses differ by at most 7.3e-5. :data:`TOL` is 1.5e-4, 2.5× the largest.
:func:`test_bf16_is_not_fp32` keeps the check honest: the MLP pipelines end 2.5e-4 from float32
training, beyond :data:`TOL`, so a pipeline that silently trained in float32 would fail.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.runtime.train import single_stage_plan

from .models import branchy_graph, chain_plan, cut, graph_plan, max_param_diff, mlp_graph, uneven_plan, v_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
TOL = 1.5e-4
BF16 = TrainConfig(steps=3, warmup_steps=1, lr=0.05, progress=False, timeout_s=60, precision="bf16")
MLP = mlp_graph(n_blocks=7)  # 8 layers: 2 stages, or 4 on 2 ranks
BRANCHY = branchy_graph()
GPT = build_model("gpt-tiny", blocks=2)  # layer norms, softmax, an embedding: float32 ops inside autocast
DIGITS = mlp_graph(n_blocks=3, width=32, features=64, classes=10)


def looping_plan(graph: LayerGraph, method: Method) -> Plan:
    """4 stages, stage ``s`` on rank ``s mod 2``, 4 micro-batches (interleaved, interleaved-zb)."""
    sizes = equal_sizes(BATCH, 4)
    stages = tuple(StagePlan(layers, (k % 2,), sizes, sizes) for k, layers in enumerate(cut(graph.names, 4)))
    return Plan(graph.name, "", BATCH, method, stages)


CASES: dict[str, tuple[LayerGraph, Plan]] = {
    **{m.value: (MLP, chain_plan(MLP, 2, BATCH, 4, m))
       for m in (Method.GPIPE, Method.ONE_F_ONE_B, Method.ZB1, Method.ZB2)},
    "interleaved": (MLP, looping_plan(MLP, Method.INTERLEAVED)),
    "interleaved-zb": (MLP, looping_plan(MLP, Method.INTERLEAVED_ZB)),
    "zbv": (MLP, v_plan(MLP, BATCH, 2, 4, Method.ZBV)),
    "dualpipev": (MLP, v_plan(MLP, BATCH, 2, 4, Method.DUALPIPEV)),
    # unequal partitions; stage 0's backward differs from its forward, so it recomputes under autocast
    "uedp": (MLP, uneven_plan(MLP, [(5, 7), (3, 4, 5)], [(6, 6), (3, 4, 5)])),
    "graph": (BRANCHY, graph_plan(BRANCHY, [("stem", "a1", "b1"), ("a2", "merge", "head")], [(0,), (1,)],
                                  [(4, 8), (6, 6)])),
    "gpt-1f1b": (GPT, chain_plan(GPT, 2, 8, 4, Method.ONE_F_ONE_B)),
    "digits-eval": (DIGITS, chain_plan(DIGITS, 2, 16, 4, Method.ONE_F_ONE_B)),
    "one-stage": (GPT, single_stage_plan(GPT, 8)),  # no message, one micro-batch: the reference's rounding
}
CONFIGS = {"digits-eval": replace(BF16, data="digits")}  # evaluates after the last step, forward-only programs


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(graph, plan, CONFIGS.get(name, BF16), return_state_dict=True)
            for name, (graph, plan) in CASES.items()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_equals_reference_bf16(results: dict[str, TrainResult], name: str) -> None:
    graph, plan = CASES[name]
    reference = reference_train(graph, plan.batch_size, CONFIGS.get(name, BF16))
    assert max_param_diff(results[name], reference) <= (0.0 if name == "one-stage" else TOL)
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)
    evaluated, expected = results[name].final_eval, reference.final_eval
    assert (evaluated is None) == (expected is None) == (name not in CONFIGS)
    if evaluated is not None and expected is not None:
        assert evaluated.eval_loss == pytest.approx(expected.eval_loss, abs=TOL)
    assert all(v.dtype == torch.float32 for v in results[name].state_dict.values() if v.is_floating_point())


def test_bf16_is_not_fp32(results: dict[str, TrainResult]) -> None:
    """Guards the comparison: float32 training ends farther than :data:`TOL` from the bf16 pipeline."""
    graph, plan = CASES["1f1b"]
    fp32 = reference_train(graph, plan.batch_size, replace(BF16, precision=None))
    assert max_param_diff(results["1f1b"], fp32) > TOL
