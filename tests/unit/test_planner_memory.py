"""The balanced and interleaved planners keep only plans that fit the devices' memory (the whole
memory model: activations in flight, the split backward's held gradients, a rank's chunks together),
unless the memory cap is off; when nothing fits they say so with the ways out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem, PlanningResult
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.profile.noise import ProfileNoise
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.memory import memory_need

BATCH = 32
NAMES = tuple(f"l{i}" for i in range(8))


def profile() -> Profile:
    """8 identical layers; large saved activations and held gradients make the methods differ in memory."""
    layers = tuple(LayerProfile(name, (1, BATCH), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 65536, 4096, 1e6,
                                held_grad_bytes_per_sample=16384) for name in NAMES)
    return Profile("synthetic", "", "cpu", "synthetic", 128, layers)


def problem(memory: int, *, cap: bool = True, every: bool = False) -> PlanningProblem:
    """With ``every``, a profile noise so wide that the planners list every candidate (they skip
    only those slower than the noise, :func:`~pipetrain.planners.score.best_first`)."""
    link = Link(1e-4, 1e9)
    cluster = Cluster(tuple(Device("cpu", memory) for _ in range(2)), link, link, "test")
    p = replace(profile(), noise=ProfileNoise(1e6, 0.03, 40, 2, 5)) if every else profile()
    return PlanningProblem(ModelRef.synthetic(list(NAMES)), CostModel(p, cluster), BATCH,
                           constraints=Constraints(memory_cap=cap))


Planner = Callable[[PlanningProblem], PlanningResult]


@pytest.mark.parametrize("planner", [plan_balanced, plan_interleaved])
def test_the_fastest_plan_that_fits_is_kept(planner: Planner) -> None:
    free = planner(problem(2**40, every=True))
    cost = CostModel(profile(), free.cluster)
    ranked = [(c.iteration_s, max(memory_need(c.plan, cost))) for c in free.candidates]  # fastest first
    smaller = sorted({need for _, need in ranked if need < ranked[0][1]})
    assert smaller, "the test needs a slower candidate that holds less memory than the fastest"
    room = smaller[-1]  # the largest need below the fastest's: the fastest no longer fits
    capped = planner(problem(room))
    assert capped.plan.prediction is not None
    assert capped.plan.prediction.iteration_s == pytest.approx(min(t for t, need in ranked if need <= room))
    assert max(memory_need(capped.plan, cost)) <= room
    assert any(not c.feasible and "over memory" in c.infeasible for c in capped.candidates)
    uncapped = planner(problem(room, cap=False))
    assert uncapped.plan.prediction is not None and max(memory_need(uncapped.plan, cost)) > room
    assert uncapped.plan.prediction.iteration_s == pytest.approx(ranked[0][0])


@pytest.mark.parametrize(("planner", "name"), [(plan_balanced, "balanced"), (plan_interleaved, "interleaved")])
def test_nothing_fits_names_the_fastest_and_the_ways_out(planner: Planner, name: str) -> None:
    with pytest.raises(UserError, match=rf"no {name} plan fits the devices' memory \(the fastest: over memory: "
                                        r"stage \d needs .*--no-memory-cap"):
        planner(problem(2**16))
    assert planner(problem(2**16, cap=False)).plan


def test_held_gradients_count() -> None:
    """zb1 holds each micro-batch's output gradients from B to W: with them the same memory no longer fits."""
    base = problem(2**40)
    zb1 = plan_balanced(replace(base, constraints=Constraints(method=Method.ZB1, n_micro=4)))
    cost = CostModel(profile(), zb1.cluster)
    need = max(memory_need(zb1.plan, cost))
    layers = tuple(replace(layer, held_grad_bytes_per_sample=0) for layer in profile().layers)
    without = replace(profile(), layers=layers)
    assert max(memory_need(zb1.plan, CostModel(without, zb1.cluster))) < need
    tight = replace(base.constraints, method=Method.ZB1, n_micro=4)
    with pytest.raises(UserError, match="no balanced plan fits"):
        plan_balanced(replace(problem(need - 1), constraints=tight))
    assert plan_balanced(replace(problem(need), constraints=tight)).plan.method is Method.ZB1
