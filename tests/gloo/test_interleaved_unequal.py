"""Interleaved 1F1B with per-virtual-stage partitions: every rank's gradients equal single-process ones.

Megatron's looping placement (Narayanan et al., SC'21) with UMPIPE's per-stage micro-batches (Zhou
et al., TPDS 2025), ordered by :mod:`pipetrain.schedule.interleaved_unequal` (issue 17). One SGD
step at learning rate 1 leaves ``w0 - g`` on every rank, so the largest parameter difference from
:func:`reference_train` is the largest gradient difference; all cases run in one launch, one of
them the plan planner ``interleaved-ga`` chose.
"""

from __future__ import annotations

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.planners.microbatch import GAConfig, plan_uedp
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many

from .models import cut, max_param_diff, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOL = 1e-5
ONE_STEP = TrainConfig(steps=1, warmup_steps=0, lr=1.0, progress=False, timeout_s=30)  # w1 = w0 - g
GRAPH = mlp_graph(n_blocks=7)  # 8 layers


def interleaved(partitions: list[tuple[int, ...]], n_ranks: int) -> Plan:
    """Stage ``k`` (of ``len(partitions)``) on rank ``k mod n_ranks`` with its own partition."""
    groups = cut(GRAPH.names, len(partitions))
    stages = tuple(StagePlan(layers, (k % n_ranks,), p, p) for k, (layers, p) in enumerate(zip(groups, partitions,
                                                                                                 strict=True)))
    return Plan(GRAPH.name, "", sum(partitions[0]), Method.INTERLEAVED, stages)


def _planned() -> Plan:
    """What ``interleaved-ga`` plans on 2 ranks x 2 chunks for a synthetic profile whose first and
    last stages cost ``a max(b, 8)`` on ``b`` samples (the rest ``a b``): ``[8], [4, 4], [4, 4], [8]``."""
    grid = (1, 2, 4, 8)

    def cost_s(saturation: int, a: float) -> tuple[float, ...]:
        return tuple(a * max(b, saturation) for b in grid)

    saturation = [8, 8, 1, 1, 1, 1, 8, 8]
    layers = tuple(LayerProfile(name, grid, cost_s(s, 0.1), cost_s(s, 0.2), 64, 64, 1000, 0.0)
                   for name, s in zip(GRAPH.names, saturation, strict=True))
    cost = CostModel(Profile(GRAPH.name, "", "cpu", "synthetic", 64, layers),
                     Cluster.local(2, link=Link(0.01, 1e6), action_overhead_s=0.01))
    return plan_uedp(interleaved([(8,)] * 4, 2), cost, planner="interleaved-ga",
                     config=GAConfig(population=24, generations=20))


CASES: dict[str, Plan] = {
    "2ranks-2chunks": interleaved([(5, 3), (2, 4, 2), (1, 6, 1), (8,)], 2),
    "2ranks-2chunks-sizes-of-1": interleaved([(1,) * 8, (8,), (3, 1, 4), (2, 2, 2, 2)], 2),
    "3ranks-2chunks": interleaved([(5, 3), (2, 4, 2), (1, 6, 1), (4, 4), (3, 3, 2), (1, 1, 6)], 3),
    "2ranks-4chunks": interleaved([(5, 3), (2, 4, 2), (8,), (1,) * 8, (4, 4), (3, 5), (2, 6), (6, 2)], 2),
    "2ranks-2chunks-interleaved-ga": _planned(),
}


@pytest.fixture(scope="module")
def results() -> dict[str, TrainResult]:
    jobs = [TrainJob(GRAPH, plan, ONE_STEP, return_state_dict=True) for plan in CASES.values()]
    return dict(zip(CASES, train_many(jobs), strict=True))


@pytest.mark.parametrize("name", list(CASES))
def test_interleaved_unequal_gradients_equal_reference(results: dict[str, TrainResult], name: str) -> None:
    plan = CASES[name]
    assert plan.virtual_stages > 1 and len({s.forward_sizes for s in plan.stages}) > 1
    reference = reference_train(GRAPH, plan.batch_size, ONE_STEP)
    assert max_param_diff(results[name], reference) <= TOL
    assert results[name].losses == pytest.approx(reference.losses, abs=TOL)
