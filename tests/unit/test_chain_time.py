"""order_time (any per-stage order) against the flush evaluator and the event simulator."""

from __future__ import annotations

import numpy as np
import pytest

from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.one_f_one_b import one_f_one_b_sequences
from pipetrain.simulate.chain import order_time
from pipetrain.simulate.events import simulate
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import StageTables

from .test_vectorised import random_backward, random_cost, random_partition, random_tables, uedp_plan


def _flush(forward: list[tuple[int, ...]], backward: list[tuple[int, ...]]) -> list[list[tuple[bool, int]]]:
    return [[*((False, j) for j in range(len(x))), *((True, j) for j in range(len(y)))]
            for x, y in zip(forward, backward, strict=True)]


def test_flush_order_equals_the_closed_form() -> None:
    """300 random instances (some stages recomputing): order_time == iteration_time to 1e-9."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        n, batch = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        tables = random_tables(rng, n, batch)
        fwd = random_partition(rng, n, batch)
        bwd = random_backward(rng, fwd, batch)
        assert order_time(_flush(fwd, bwd), fwd, bwd, tables) == pytest.approx(
            iteration_time(fwd, bwd, tables), rel=1e-9, abs=1e-12)


def test_unequal_1f1b_equals_the_event_simulator() -> None:
    """300 random 1F1B plans with per-stage partitions on random cost models: == simulate() to 1e-9."""
    rng = np.random.default_rng(6)
    for _ in range(300):
        n, batch = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        cost, stages = random_cost(rng, n, batch)
        sizes = random_partition(rng, n, batch)
        plan = Plan("random", "", batch, Method.ONE_F_ONE_B,
                    tuple(StagePlan(layers, (k,), sizes[k], sizes[k]) for k, layers in enumerate(stages)))
        tables = StageTables.from_plan(plan, cost)
        expected = simulate(build_schedule(plan), plan, cost).iteration_s
        assert order_time(one_f_one_b_sequences(sizes), sizes, sizes, tables) == pytest.approx(expected, rel=1e-9)


def test_flush_plans_equal_the_event_simulator() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        n, batch = int(rng.integers(1, 6)), int(rng.integers(1, 17))
        cost, stages = random_cost(rng, n, batch)
        fwd = random_partition(rng, n, batch)
        bwd = random_backward(rng, fwd, batch)
        plan = uedp_plan(stages, batch, fwd, bwd, recompute=False)
        expected = simulate(build_schedule(plan), plan, cost).iteration_s
        got = order_time(_flush(fwd, bwd), fwd, bwd, StageTables.from_plan(plan, cost))
        assert got == pytest.approx(expected, rel=1e-9)


def test_deadlocking_orders_are_reported() -> None:
    tables = random_tables(np.random.default_rng(0), 2, 2)
    # stage 0 wants its gradient before it has sent anything
    with pytest.raises(ValueError, match="deadlock"):
        order_time([[(True, 0), (False, 0)], [(False, 0), (True, 0)]], [(2,), (2,)], [(2,), (2,)], tables)
