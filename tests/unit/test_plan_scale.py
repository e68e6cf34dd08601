"""Planning at scale (issue 30): the lower bound holds, and best-first scoring keeps the winner (balanced,
interleaved)."""

from __future__ import annotations

import random

import pytest

from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import METHODS as SPECS
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan, plan_balanced
from pipetrain.planners.contract import Candidate, Constraints, ModelRef, PlanningProblem, rank_key
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.interleaved import build_interleaved_plan, plan_interleaved, runs_with
from pipetrain.planners.score import best_first, memory_checked, score
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.bounds import chain_lower_bound_s

BATCH = 16
METHODS = (Method.GPIPE, Method.ONE_F_ONE_B, Method.ZB1, Method.ZB2)
MIB = 2**20


def profile(seed: int, n_layers: int = 6) -> Profile:
    """Layers of seeded, uneven costs (a fixed part and a per-sample part), small messages."""
    rng = random.Random(seed)
    layers = []
    for i in range(n_layers):
        fixed, per = rng.uniform(1e-4, 2e-3), rng.uniform(1e-4, 1e-3)
        forward = (fixed + per, fixed + BATCH * per)
        layers.append(LayerProfile(f"l{i}", (1, BATCH), forward, tuple(2 * t for t in forward), rng.choice([64, 4096]),
                                   rng.choice([256, MIB]), 4096, 1e5))
    return Profile("synthetic", "", "cpu", "synthetic", BATCH, tuple(layers))


def cost(seed: int, ranks: int, memory: int = 2**40, shared: tuple[float, ...] = ()) -> CostModel:
    link = Link(1e-4, 1e8)
    devices = tuple(Device("cpu", memory, node=r // 2) for r in range(ranks))
    return CostModel(profile(seed), Cluster(devices, link, link, "test", shared_speed=shared))


@pytest.mark.parametrize("shared", [(), (1.0, 0.7)])
def test_the_chain_bound_never_exceeds_the_simulated_time(shared: tuple[float, ...]) -> None:
    for seed in range(3):
        c = cost(seed, 3, shared=shared)
        model = ModelRef.synthetic([f"l{i}" for i in range(6)])
        for method in METHODS:
            for m in (1, 2, 5, 16):
                plan = build_balanced_plan(model, c, method=method, n_stages=3, batch_size=BATCH, n_micro=m)
                for p in (plan, plan.with_recompute()):
                    bound, simulated = chain_lower_bound_s(p, c), score(p, c).iteration_s
                    assert 0.5 * simulated < bound <= simulated, (seed, method, m)


def exhaustive(problem: PlanningProblem) -> list[Candidate]:
    """Every balanced plan scored, ranked as the planner ranks them."""
    plans = [build_balanced_plan(problem.model, problem.cost, method=method, n_stages=problem.cost.cluster.n_devices,
                                 batch_size=BATCH, n_micro=m) for method in METHODS for m in candidate_counts(BATCH)]
    scored = [memory_checked(score(p, problem.cost), problem.cost, problem.optimizer) for p in plans]
    return sorted(scored, key=rank_key)


@pytest.mark.parametrize("seed", range(4))
def test_best_first_keeps_the_exhaustive_winner(seed: int) -> None:
    for ranks, memory in ((2, 2**40), (3, 2**40), (3, 20 * MIB)):
        problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(6)]), cost(seed, ranks, memory), BATCH,
                                  constraints=Constraints(recompute="none"))
        every = exhaustive(problem)
        chosen = plan_balanced(problem)
        assert chosen.plan == every[0].plan, (seed, ranks, memory)
        found = best_first([c.plan for c in every], problem.cost)
        assert len(found) <= len(every)
        assert sorted(found, key=rank_key)[0].plan == every[0].plan


INTERLEAVED = (Method.INTERLEAVED, Method.INTERLEAVED_ZB, Method.ZBV, Method.DUALPIPEV)


def interleaved_plans(c: CostModel, ranks: int) -> list[Plan]:
    """Every plan the interleaved planner weighs on ``ranks`` ranks of a 6-layer model, 2 chunks each."""
    model = ModelRef.synthetic([f"l{i}" for i in range(6)])
    return [build_interleaved_plan(model, c, n_ranks=ranks, chunks=2, batch_size=BATCH, n_micro=m, method=method)
            for method in INTERLEAVED for m in thinned_counts(BATCH) if runs_with(SPECS[method], m, 2 * ranks)]


@pytest.mark.parametrize("shared", [(), (1.0, 0.7)])
def test_the_bound_holds_for_ranks_with_several_stages(shared: tuple[float, ...]) -> None:
    """Interleaved (looping) and V-placed plans: each rank's work after its earliest fill."""
    for seed in range(3):
        c = cost(seed, 3, shared=shared)
        for plan in interleaved_plans(c, 3):
            for p in (plan, plan.with_recompute()):
                bound, simulated = chain_lower_bound_s(p, c), score(p, c).iteration_s
                assert 0.4 * simulated < bound <= simulated * (1 + 1e-12), (seed, p.method, p.stages[0].forward_sizes)


@pytest.mark.parametrize("seed", range(3))
def test_the_interleaved_planner_keeps_the_exhaustive_winner(seed: int) -> None:
    """Best-first scoring in plan_interleaved picks the plan that scoring every candidate picks."""
    for ranks, memory in ((2, 2**40), (3, 2**40), (3, 20 * MIB)):
        c = cost(seed, ranks, memory)
        problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(6)]), c, BATCH,
                                  constraints=Constraints(recompute="none", n_micro=None))
        every = sorted((memory_checked(score(p, c), c) for p in interleaved_plans(c, ranks)), key=rank_key)
        chosen = plan_interleaved(problem)
        assert len(chosen.candidates) <= len(every)
        if every[0].feasible:
            assert chosen.plan == every[0].plan, (seed, ranks, memory)
