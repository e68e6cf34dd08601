"""Planner zb1-ga: unequal micro-batches under the ZB-H1 order (Qi et al., ICLR 2024; UMPIPE's
per-stage partitions, Zhou et al., TPDS 2025). Its evaluator (split_order_time) against the event
simulator, the planner's score against the simulated plan, and its wiring."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.microbatch import GAConfig, plan_uedp
from pipetrain.planners.microbatch.ga import ga, zb1_ga
from pipetrain.planners.microbatch.uedp import with_sizes
from pipetrain.planners.registry import MICROBATCH_PLANNERS
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.one_f_one_b import one_f_one_b_sequences
from pipetrain.schedule.zero_bubble import zb1_sequences
from pipetrain.simulate.chain import split_order_time
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables
from tests.conftest import flat_profile

from .test_vectorised import random_cost, random_partition

SMALL = GAConfig(population=12, generations=8)


def split_cost(rng: np.random.Generator, n: int, batch: int) -> tuple[CostModel, tuple[tuple[str, ...], ...]]:
    """:func:`random_cost` with a measured W share per layer, random in [0, 1] of the backward."""
    cost, stages = random_cost(rng, n, batch)
    layers = tuple(replace(lp, weight_grad_s=tuple(float(rng.uniform(0.0, 1.0)) * b for b in lp.backward_s))
                   for lp in cost.profile.layers)
    return CostModel(replace(cost.profile, layers=layers), cost.cluster), stages


def zb1_plan(stages: tuple[tuple[str, ...], ...], sizes: list[tuple[int, ...]]) -> Plan:
    return Plan("random", "", sum(sizes[0]), Method.ZB1,
                tuple(StagePlan(layers, (k,), sizes[k], sizes[k]) for k, layers in enumerate(stages)))


def test_split_order_time_equals_the_event_simulator() -> None:
    """300 random zb1 plans with per-stage partitions on random cost models, random stages recomputing
    (their B with the forward re-run): == simulate() to 1e-9."""
    rng = np.random.default_rng(17)
    for _ in range(300):
        n, batch = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        cost, stages = split_cost(rng, n, batch)
        sizes = random_partition(rng, n, batch)
        plan = zb1_plan(stages, sizes).with_recompute(k for k in range(n) if rng.random() < 0.3)
        expected = simulate(build_schedule(plan), plan, cost).iteration_s
        order = zb1_sequences(one_f_one_b_sequences(sizes))
        assert split_order_time(order, sizes, StageTables.from_plan(plan, cost)) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 16))
def test_zb1_ga_score_equals_the_event_simulator(seed: int, n: int, batch: int) -> None:
    """The plan zb1-ga returns, simulated as a zb1 plan, takes exactly the time the GA scored."""
    rng = np.random.default_rng(seed)
    cost, stages = split_cost(rng, n, batch)
    base = zb1_plan(stages, [equal_sizes(batch, 1)] * n)
    result = zb1_ga(StageTables.from_plan(base, cost), seed=seed % 1000, config=SMALL)
    plan = with_sizes(base, result)
    plan.validate()
    assert plan.method is Method.ZB1 and result.planner == "zb1-ga"
    assert result.forward_sizes == result.backward_sizes
    assert result.iteration_s == pytest.approx(simulate(build_schedule(plan), plan, cost).iteration_s, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_zb1_ga_is_never_worse_than_the_best_equal_zb1_plan(seed: int) -> None:
    """Seeded with the equal ZB-H1 plans; the same seed gives the same plan."""
    rng = np.random.default_rng(seed)
    n, batch = int(rng.integers(2, 5)), int(rng.integers(4, 20))
    cost, stages = split_cost(rng, n, batch)
    tables = StageTables.from_plan(zb1_plan(stages, [(batch,)] * n), cost)
    equal = min(split_order_time(zb1_sequences(one_f_one_b_sequences([s] * n)), [s] * n, tables)
                for s in (equal_sizes(batch, m) for m in range(1, batch + 1)))
    result = zb1_ga(tables, seed=seed, config=SMALL)
    assert result.iteration_s <= equal
    assert result == zb1_ga(tables, seed=seed, config=SMALL)
    with pytest.raises(ValueError, match="mode='single'"):
        ga(tables, evaluator="zb1", mode="dual")


def test_tables_without_split_rows_are_refused() -> None:
    full = StageTables.from_cost_model(CostModel(flat_profile(2), Cluster.local(2)), [("l0",), ("l1",)], [0, 1], 4)
    plain = StageTables(full.forward_s, full.backward_s, full.send_forward_s, full.send_backward_s)
    with pytest.raises(ValueError, match="split backward"):
        zb1_ga(plain, config=SMALL)
    with pytest.raises(ValueError, match="both"):
        StageTables(full.forward_s, full.backward_s, full.send_forward_s, full.send_backward_s,
                    backward_input_s=full.backward_input_s)


def test_plan_uedp_zb1_ga_with_and_without_recompute() -> None:
    profile = flat_profile(3, [0.2, 0.4, 0.3], [0.5, 0.6, 0.4], per_sample=True, output_bytes=1000,
                           parameter_bytes=100)
    cost = CostModel(profile, Cluster.local(3, link=Link(0.05, 1e5), action_overhead_s=0.1))
    sizes = equal_sizes(12, 3)
    base = Plan("synthetic", "", 12, Method.ONE_F_ONE_B,
                tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(3)))
    plan = plan_uedp(base, cost, planner="zb1-ga", config=SMALL)
    assert plan.method is Method.ZB1 and plan.prediction is not None
    assert "zb1-ga" in MICROBATCH_PLANNERS
    recomputed = plan_uedp(base.with_recompute([1]), cost, planner="zb1-ga", config=SMALL)
    assert recomputed.method is Method.ZB1 and recomputed.recompute_stages == (1,)
    assert recomputed.prediction is not None and recomputed.prediction.iteration_s > plan.prediction.iteration_s
