"""Memory caps on micro-batch sizes (PAPERS.md §1.12) and the planners and API that respect them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain import api
from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.memory import parameter_copies
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.microbatch import GA_PLANNERS, PLANNER_NAMES, GAConfig, fits_without_recompute, microbatch_caps
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.memory import device_memory, memory_need

BATCH = 32
PARAMS, SAVED, OUT, INPUT = 4096, 16384, 8192, 128  # bytes: per layer; per sample
GA = GAConfig(population=12, generations=6)


def profile() -> Profile:
    """4 identical layers (2 a stage); f(b) and g(b) grow with b, so several micro-batches pay off."""
    layers = tuple(
        LayerProfile(f"l{i}", (1, BATCH), (1e-3, 8e-3), (2e-3, 16e-3), OUT, SAVED, PARAMS, 1e6) for i in range(4)
    )
    return Profile("synthetic", "", "cpu", "synthetic", INPUT, layers)


def cluster(*memory: int) -> Cluster:
    link = Link(1e-4, 1e9)
    return Cluster(tuple(Device("cpu", m) for m in memory), link, link, "test")


def base_plan(c: Cluster) -> Plan:
    return build_balanced_plan(ModelRef.synthetic([f"l{i}" for i in range(4)]), CostModel(profile(), c),
                               method=Method.GPIPE, n_stages=2, batch_size=BATCH, n_micro=4)


def micro(base: Plan, prof: Profile, c: Cluster, *, planner: str, ga: GAConfig | None = None, seed: int = 0,
          memory_cap: bool = True) -> Plan:
    """``planner`` on ``base``'s stages through :func:`pipetrain.api.plan`."""
    constraints = api.Constraints(base=base, ga=ga, seed=seed, memory_cap=memory_cap)
    return api.plan(ModelRef.of_plan(base), prof, c, planner=planner, constraints=constraints).plan


def room_for(stage: int, b: int) -> int:
    """Exactly the bytes a recomputing stage needs with micro-batches of at most ``b`` samples."""
    inputs = (INPUT if stage == 0 else OUT) * BATCH
    return parameter_copies("sgd") * 2 * PARAMS + inputs + 2 * SAVED * b


def test_no_caps_when_the_whole_batch_fits() -> None:
    c = cluster(room_for(0, BATCH), room_for(1, BATCH))
    assert microbatch_caps(base_plan(c), CostModel(profile(), c)) == (None, None)
    assert fits_without_recompute(base_plan(c), CostModel(profile(), c)) == (True, True)


def test_caps_are_the_largest_size_that_fits() -> None:
    c = cluster(room_for(0, 5), room_for(1, 11) - 1)  # exactly 5 fit; 11 miss by one byte
    assert microbatch_caps(base_plan(c), CostModel(profile(), c)) == (5, 10)
    assert fits_without_recompute(base_plan(c), CostModel(profile(), c)) == (False, False)
    assert microbatch_caps(base_plan(c), CostModel(profile(), c), optimizer="adam")[0] == 4  # Adam: 4 parameter copies


def test_impossible_memory_names_the_stage() -> None:
    c = cluster(room_for(0, 8), room_for(1, 1) - 1)
    with pytest.raises(UserError, match=r"stage 1 \(l2 … l3, rank 1\) needs 0\.3 MiB even with micro-batches of one"):
        microbatch_caps(base_plan(c), CostModel(profile(), c))
    with pytest.raises(UserError, match="stage 1"):
        micro(base_plan(c), profile(), c, planner="equal")


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_planners_respect_caps_and_fit(planner: str) -> None:
    c = cluster(room_for(0, 5), room_for(1, 7))
    base = base_plan(c)
    ga = GA if planner in GA_PLANNERS else None  # the other planners refuse a GA budget
    refusals = {"interleaved-ga": "needs a base plan of method interleaved"}
    if planner in refusals:
        with pytest.raises(UserError, match=refusals[planner]):
            micro(base, profile(), c, planner=planner, ga=ga)
        return
    plan = micro(base, profile(), c, planner=planner, ga=ga)
    plan.validate()
    assert plan.recompute_stages == (0, 1)  # neither stage holds the whole batch's activations
    for stage, cap in zip(plan.stages, (5, 7), strict=True):
        assert max(*stage.forward_sizes, *stage.backward_sizes) <= cap
    cost = CostModel(profile(), c)
    assert all(need <= room for need, room in zip(memory_need(plan, cost), device_memory(plan, cost), strict=True))


def test_no_memory_cap_ignores_memory() -> None:
    c = cluster(room_for(0, 5), room_for(1, 7))
    plan = micro(base_plan(c), profile(), c, planner="dp", memory_cap=False)
    assert not plan.recompute_stages and max(plan.stages[0].forward_sizes) > 5


def test_ample_memory_keeps_activations() -> None:
    c = cluster(2**30, 2**30)
    plan = micro(base_plan(c), profile(), c, planner="tidgap", ga=GA, seed=1)
    assert not plan.recompute_stages
    assert plan == micro(base_plan(c), profile(), c, planner="tidgap", ga=GA, seed=1)


def test_api_rejects_unknown_planner_and_uedp_in_plan_pipeline() -> None:
    c = cluster(2**30, 2**30)
    with pytest.raises(UserError, match="unknown micro-batch planner 'nosuch'"):
        micro(base_plan(c), profile(), c, planner="nosuch")
    graph = api.resolve_model("gpt-tiny")
    with pytest.raises(UserError, match="use a micro-batch planner"):
        api.plan(graph, profile(), c, batch_size=BATCH, planner="balanced",
                 constraints=api.Constraints(method=Method.UEDP))


def held_profile(held: int) -> Profile:
    """:func:`profile` whose layers' split backward holds ``held`` bytes per sample from B to W."""
    base = profile()
    return replace(base, layers=tuple(replace(layer, held_grad_bytes_per_sample=held) for layer in base.layers))


def test_zb1_ga_plan_is_checked_with_the_held_gradients() -> None:
    """zb1-ga is allowed where each stage holds the whole batch's activations, but its split backward
    also holds output gradients from B to W, which the caps' flush formula cannot see: the plan is
    checked with the whole memory model, and one that overflows is refused with the fix."""
    fits_activations = parameter_copies("sgd") * 2 * PARAMS + 2 * SAVED * BATCH
    c = cluster(fits_activations, fits_activations)
    base = replace(base_plan(c), method=Method.ZB1)
    plan = micro(base, held_profile(0), c, planner="zb1-ga", ga=GA)
    assert plan.method is Method.ZB1 and not plan.recompute_stages
    with pytest.raises(UserError, match=r"zb1 plan needs \d+ bytes on the rank of stage \d.*B to W; use planner "
                                        r"1f1b-ga"):
        micro(base, held_profile(4 * SAVED), c, planner="zb1-ga", ga=GA)
    assert micro(base, held_profile(4 * SAVED), c, planner="zb1-ga", ga=GA, memory_cap=False)
