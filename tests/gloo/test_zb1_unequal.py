"""Method zb1 with unequal per-stage micro-batches: every rank's gradients equal single-process ones.

Zero Bubble's ZB-H1 order (Qi et al., ICLR 2024) over UMPIPE-style per-stage partitions (Zhou et
al., TPDS 2025), as planner ``zb1-ga`` plans them (issue 17). One SGD step at learning rate 1 from
the same initial weights leaves ``w0 - g`` on every rank, so the largest parameter difference from
:func:`reference_train` is the largest gradient difference. The cases run in one launch
(``train_many``): the brief's 2- and 3-rank partitions, sizes of 1, and a plan ``zb1-ga`` chose.
"""

from __future__ import annotations

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.microbatch import GAConfig, plan_uedp
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule

from .models import max_param_diff, mlp_graph, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOL = 1e-5
ONE_STEP = TrainConfig(steps=1, warmup_steps=0, lr=1.0, progress=False, timeout_s=30)  # w1 = w0 - g
GRAPH = mlp_graph()  # block0..block3, head: 5 layers


def _planned(n_stages: int, batch: int) -> Plan:
    """What ``zb1-ga`` plans for the test model on a synthetic profile: each layer costs ``a max(b, s)``
    on ``b`` samples, saturating at ``s = batch`` for the first layer and 1 for the others, so stage 0
    wants fewer micro-batches than the rest (3 stages: ``[4, 4]``, then ``[2, 2, 2, 2]`` twice)."""
    grid = (1, 2, 4, 8)

    def cost_s(saturation: int, a: float) -> tuple[float, ...]:
        return tuple(a * max(b, saturation) for b in grid)

    layers = tuple(LayerProfile(name, grid, cost_s(s, 0.1), cost_s(s, 0.2), 64, 64, 1000, 0.0,
                                weight_grad_s=cost_s(s, 0.1))
                   for name, s in zip(GRAPH.names, [batch] + [1] * (len(GRAPH) - 1), strict=True))
    cost = CostModel(Profile(GRAPH.name, "", "cpu", "synthetic", 64, layers),
                     Cluster.local(n_stages, link=Link(0.01, 1e6), action_overhead_s=0.01))
    base = uneven_plan(GRAPH, [(batch,)] * n_stages, method=Method.ONE_F_ONE_B)
    return plan_uedp(base, cost, planner="zb1-ga", config=GAConfig(population=16, generations=10))


CASES: dict[str, Plan] = {
    "2ranks": uneven_plan(GRAPH, [(5, 3), (2, 4, 2)], method=Method.ZB1),
    "3ranks": uneven_plan(GRAPH, [(5, 3), (2, 4, 2), (1, 6, 1)], method=Method.ZB1),
    "3ranks-sizes-of-1": uneven_plan(GRAPH, [(1,) * 8, (8,), (3, 1, 4)], method=Method.ZB1),
    "3ranks-zb1-ga": _planned(3, 8),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, plan, ONE_STEP, return_state_dict=True) for plan in CASES.values()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_zb1_unequal_gradients_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    plan = CASES[name]
    assert plan.method is Method.ZB1 and len({s.forward_sizes for s in plan.stages}) > 1  # unequal per stage
    assert any(a.kind is ActionKind.W for _, program in build_schedule(plan) for a in program)
    reference = reference_train(GRAPH, plan.batch_size, ONE_STEP)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)
