"""Interleaved 1F1B with per-virtual-stage partitions (issue 17; Narayanan et al. SC'21 with UMPIPE's
unequal micro-batches, Zhou et al. TPDS 2025): orders, the in-order receive pass, the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.microbatch.ga import interleaved_ga
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.interleaved import interleaved_orders
from pipetrain.schedule.interleaved_unequal import unequal_interleaved_orders
from pipetrain.simulate.chain import interleaved_order_time
from pipetrain.simulate.events import simulate
from pipetrain.simulate.vectorised import StageTables
from tests.conftest import flat_profile

from .test_vectorised import random_cost, random_partition


def interleaved(partitions: list[tuple[int, ...]], n_ranks: int) -> Plan:
    stages = tuple(StagePlan((f"l{k}",), (k % n_ranks,), p, p) for k, p in enumerate(partitions))
    return Plan("toy", "", sum(partitions[0]), Method.INTERLEAVED, stages)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    n_ranks, chunks, batch = draw(st.integers(2, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 12))
    partitions = []
    for _ in range(n_ranks * chunks):
        cuts = draw(st.sets(st.integers(1, batch - 1), max_size=batch - 1)) if batch > 1 else set()
        ends = [*sorted(cuts), batch]
        partitions.append(tuple(b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)))
    return interleaved(partitions, n_ranks)


@settings(max_examples=150, deadline=None)
@given(plans())
def test_random_partitions_give_valid_deadlock_free_schedules(plan: Plan) -> None:
    """The validator's dry run (FIFO links included) passes; every stage runs each of its
    micro-batches once forward and once backward, on its own rank, and then steps."""
    schedule = build_schedule(plan)
    for rank, program in schedule:
        for k in plan.stages_of_rank(rank):
            for kind in (ActionKind.F, ActionKind.B):
                ran = [a.microbatch for a in program if a.stage == k and a.kind is kind]
                assert ran == list(range(len(plan.stages[k].forward_sizes)))
            assert sum(a.stage == k and a.kind is ActionKind.STEP for a in program) == 1


def test_equal_partitions_keep_megatrons_order() -> None:
    """Only plans whose stages differ take the list-scheduled order (Megatron's: test_interleaved.py)."""
    compute = [[str(a).split("[")[0] for a in p if a.kind in (ActionKind.F, ActionKind.B)]
               for _, p in build_schedule(interleaved([(2,) * 4] * 4, 2))]
    assert " ".join(compute[0]) == "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"


def test_two_stages_of_a_link_are_received_in_send_order() -> None:
    """Rank 0 sends stage 0's and stage 2's activations to rank 1 on one link; rank 1 receives them
    in that order (FIFO), whatever order its stages consume them in."""
    plan = interleaved([(1,) * 6, (6,), (3, 3), (2, 4)], 2)
    programs = dict(build_schedule(plan))
    for rank, peer in ((0, 1), (1, 0)):
        sent = [(a.stage, a.microbatch) for a in programs[rank] if a.kind is ActionKind.SEND_F]
        received = [(a.stage - 1, a.microbatch) for a in programs[peer] if a.kind is ActionKind.RECV_F]
        assert sent == received


def test_unequal_orders_refuse_partitions_of_different_batches() -> None:
    with pytest.raises(ValueError, match="multiple of the rank count"):
        unequal_interleaved_orders([(2,), (2,), (2,)], 2)
    with pytest.raises(ValueError, match="each must sum to the batch"):
        unequal_interleaved_orders([(2,), (3,)], 2)


def test_simulator_times_per_stage_partitions() -> None:
    """Stage 0 slow per micro-batch, the rest per sample: fewer, larger micro-batches there pay off."""
    profile = flat_profile(4, [0.5, 0.1, 0.1, 0.1], [0.5, 0.2, 0.2, 0.2], per_sample=True)
    cost = CostModel(profile, Cluster.local(2, link=Link(0.0, 1e30), action_overhead_s=0.3))
    unequal = interleaved([(4, 4), (2, 2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 2)], 2)
    timeline = simulate(build_schedule(unequal), unequal, cost)
    assert timeline.iteration_s > 0 and timeline.n_ranks == 2


def test_interleaved_order_time_equals_the_event_simulator() -> None:
    """200 random interleaved plans (per-stage or equal partitions) on random cost models: the
    per-rank evaluator == simulate() to 1e-9, shared links (R = 2: both directions) included."""
    rng = np.random.default_rng(23)
    for i in range(200):
        n_ranks, chunks, batch = int(rng.integers(2, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 17))
        cost, stages = random_cost(rng, n_ranks * chunks, batch)
        equal = [equal_sizes(batch, min(3, batch))] * len(stages)
        sizes = random_partition(rng, n_ranks * chunks, batch) if i % 4 else equal
        plan = Plan("random", "", batch, Method.INTERLEAVED,
                    tuple(StagePlan(layers, (k % n_ranks,), sizes[k], sizes[k]) for k, layers in enumerate(stages)))
        expected = simulate(build_schedule(plan), plan, cost).iteration_s
        tables = StageTables.from_plan(plan, cost)
        got = interleaved_order_time(interleaved_orders(sizes, n_ranks), sizes, n_ranks, tables)
        assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_interleaved_ga_scores_what_the_simulator_says_and_beats_equal(seed: int) -> None:
    """Seeded with the equal (Megatron) orders: never slower than the best equal interleaved plan on
    these stages, and its score is the event simulator's time of the plan it returns."""
    rng = np.random.default_rng(seed)
    n_ranks, chunks, batch = 2, int(rng.integers(1, 3)), int(rng.integers(4, 13))
    cost, stages = random_cost(rng, n_ranks * chunks, batch)

    def plan_of(sizes: list[tuple[int, ...]]) -> Plan:
        return Plan("random", "", batch, Method.INTERLEAVED,
                    tuple(StagePlan(layers, (k % n_ranks,), sizes[k], sizes[k]) for k, layers in enumerate(stages)))

    def simulated(p: Plan) -> float:
        return simulate(build_schedule(p), p, cost).iteration_s

    result = interleaved_ga(StageTables.from_plan(plan_of([(batch,)] * len(stages)), cost), n_ranks, seed=seed,
                            config=GAConfig(population=12, generations=8))
    assert result.planner == "interleaved-ga" and result.forward_sizes == result.backward_sizes
    assert result.iteration_s == pytest.approx(simulated(plan_of(list(result.forward_sizes))), rel=1e-9)
    best_equal = min(simulated(plan_of([equal_sizes(batch, m)] * len(stages))) for m in range(1, batch + 1))
    assert result.iteration_s <= best_equal * (1 + 1e-9)
