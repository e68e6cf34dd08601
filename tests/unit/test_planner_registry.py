"""The planner registry: every planner behind one contract (pipetrain.planners.contract), the
constraints each refuses, unknown names, and the one scorer every planner ranks with."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.planners import (
    MICROBATCH_PLANNERS,
    PLANNERS,
    STAGE_PLANNERS,
    Constraints,
    ModelRef,
    PlanningProblem,
    PlanningResult,
    get_planner,
    rank_key,
    run_planner,
)
from pipetrain.planners.auto import AutoReport
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.score import score
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.steady import steady_state

BATCH, N_LAYERS = 16, 6
PARAMS, SAVED, OUT, INPUT = 4096, 16384, 8192, 128  # bytes: per layer; per sample
SMALL_GA = GAConfig(population=8, generations=4)
NAMES = tuple(f"l{i}" for i in range(N_LAYERS))


def profile() -> Profile:
    """Identical layers whose f(b) and g(b) grow with b, so several micro-batches pay off."""
    layers = tuple(
        LayerProfile(name, (1, BATCH), (1e-3, 8e-3), (2e-3, 16e-3), OUT, SAVED, PARAMS, 1e6) for name in NAMES
    )
    return Profile("synthetic", "", "cpu", "synthetic", INPUT, layers)


def cost(n_devices: int = 2, memory_bytes: int = 2**30) -> CostModel:
    """``n_devices`` CPUs (default: ample memory) in two servers (pipedream sees two levels)."""
    link = Link(1e-4, 1e9)
    per_node = max(1, n_devices // 2)
    devices = tuple(Device("cpu", memory_bytes, node=r // per_node) for r in range(n_devices))
    return CostModel(profile(), Cluster(devices, link, link, f"test-{n_devices}"))


def problem(constraints: Constraints | None = None, n_devices: int = 2) -> PlanningProblem:
    return PlanningProblem(ModelRef.synthetic(NAMES), cost(n_devices), BATCH, constraints=constraints or Constraints())


def small_constraints(name: str) -> Constraints:
    """The default constraints, with a small GA budget for the planners that take one."""
    return Constraints(ga=SMALL_GA) if "ga" in PLANNERS[name].accepts else Constraints()


def test_the_registry_lists_stage_planners_then_microbatch_planners() -> None:
    assert STAGE_PLANNERS == ("balanced", "pipedream", "bapipe", "graphpipe", "interleaved", "auto", "2bw", "local")
    assert set(MICROBATCH_PLANNERS) >= {"equal", "greedy", "dp", "dgap", "tidgap", "single", "1f1b-ga", "zb1-ga"}
    assert tuple(PLANNERS) == (*STAGE_PLANNERS, *MICROBATCH_PLANNERS)
    fields = {f.name for f in dataclasses.fields(Constraints)}
    for name, spec in PLANNERS.items():
        assert spec.name == name and spec.summary
        assert spec.accepts <= fields, f"{name} accepts constraints Constraints does not have"


@pytest.mark.parametrize("name", list(PLANNERS))
def test_every_planner_keeps_the_contract(name: str) -> None:
    p = problem(small_constraints(name))
    result = run_planner(name, p)
    assert isinstance(result, PlanningResult) and result.planner == name
    plan = result.plan
    plan.validate(NAMES, "")
    build_schedule(plan)  # a schedule the runtime can execute
    assert plan.batch_size == BATCH
    assert plan.prediction is not None and math.isfinite(plan.prediction.iteration_s)
    assert plan.prediction.iteration_s > 0 and "simulated" in plan.prediction.basis
    assert result.cluster.n_devices >= plan.n_ranks
    # the prediction is the event simulator's, on the cluster the plan's ranks index (an asynchronous
    # plan's: its steady-state seconds per batch)
    sub = p.cost.on(result.cluster)
    truth = (steady_state(plan, sub).batch_s if plan.asynchronous
             else simulate(build_schedule(plan), plan, sub).iteration_s)
    assert plan.prediction.iteration_s == pytest.approx(truth, rel=1e-9)
    # candidates: the winner among them, feasible ones first, fastest first
    assert result.candidates and any(c.plan == plan for c in result.candidates)
    keys = [rank_key(c) for c in result.candidates]
    assert keys == sorted(keys)
    assert result.candidates[0].feasible
    for c in result.candidates:
        c.plan.validate(NAMES, "")
        assert c.cluster is None or c.cluster.n_devices >= c.plan.n_ranks
    # deterministic: the same problem gives the same plan
    assert run_planner(name, p).plan == plan


@pytest.mark.parametrize("name", ["balanced", "pipedream", "bapipe", "graphpipe", "interleaved"])
def test_stage_planners_plan_on_more_devices(name: str) -> None:
    result = run_planner(name, problem(small_constraints(name), n_devices=4))
    result.plan.validate(NAMES, "")
    assert result.cluster.n_devices >= result.plan.n_ranks
    assert result.plan.prediction is not None


def test_auto_ranks_its_candidates_as_the_contract_says() -> None:
    # tight memory: tidgap and 1f1b-ga tie to 3 significant digits, 1f1b-ga with half the activations
    result = run_planner("auto", PlanningProblem(ModelRef.synthetic(NAMES), cost(2, 300_000), BATCH))
    keys = [rank_key(c) for c in result.candidates]
    assert keys == sorted(keys)


def test_microbatch_planners_keep_a_given_base_plans_stages() -> None:
    base = build_balanced_plan(ModelRef.synthetic(NAMES), cost(), method=Method.GPIPE, n_stages=2,
                               batch_size=BATCH, n_micro=4)
    for name in MICROBATCH_PLANNERS:
        given = dataclasses.replace(base, method=Method.INTERLEAVED) if name == "interleaved-ga" else base  # v = 1
        constraints = dataclasses.replace(small_constraints(name), base=given)
        plan = run_planner(name, problem(constraints)).plan
        assert [(s.layers, s.ranks) for s in plan.stages] == [(s.layers, s.ranks) for s in base.stages], name


@pytest.mark.parametrize(("name", "constraints", "refused"), [
    ("pipedream", Constraints(n_micro=4), "n_micro"),
    ("pipedream", Constraints(seed=1), "seed"),
    ("dp", Constraints(seed=1), "seed"),
    ("greedy", Constraints(ga=SMALL_GA), "ga"),
    ("balanced", Constraints(seed=1), "seed"),
    ("bapipe", Constraints(n_micro=4), "n_micro"),
    ("auto", Constraints(n_stages=2), "n_stages"),
])
def test_a_planner_refuses_constraints_it_does_not_use(name: str, constraints: Constraints, refused: str) -> None:
    spec = get_planner(name)
    assert spec.ignored(constraints) == (refused,)
    with pytest.raises(UserError, match=rf"the {name} planner chooses {refused} itself or does not use it; "
                                        rf"leave {refused} unset"):
        spec.check(constraints)
    with pytest.raises(UserError, match=rf"the {name} planner chooses {refused}"):
        run_planner(name, problem(constraints))


def test_several_refused_constraints_are_named_together() -> None:
    constraints = Constraints(n_micro=4, seed=1)
    assert get_planner("pipedream").ignored(constraints) == ("n_micro", "seed")
    with pytest.raises(UserError, match="chooses n_micro, seed itself or does not use them"):
        get_planner("pipedream").check(constraints)


def test_a_planner_accepts_the_constraints_it_uses() -> None:
    get_planner("balanced").check(Constraints(method=Method.ONE_F_ONE_B, n_stages=2, n_micro=4))
    get_planner("tidgap").check(Constraints(seed=3, ga=SMALL_GA, memory_cap=False))
    get_planner("bapipe").check(Constraints(n_stages=2, seed=3, ga=SMALL_GA))
    get_planner("auto").check(Constraints(seed=3))
    for spec in PLANNERS.values():
        spec.check(Constraints())  # the defaults are never refused


def test_balanced_honours_its_constraints() -> None:
    result = run_planner("balanced", problem(Constraints(method=Method.ONE_F_ONE_B, n_stages=2, n_micro=4)))
    assert result.plan.method is Method.ONE_F_ONE_B and result.plan.n_stages == 2
    assert len(result.plan.stages[0].forward_sizes) == 4 and len(result.candidates) == 1


def test_unknown_planner_names_every_planner() -> None:
    with pytest.raises(UserError, match="unknown planner 'nosuch'") as info:
        get_planner("nosuch")
    assert all(name in str(info.value) for name in PLANNERS)
    with pytest.raises(UserError, match="unknown planner 'nosuch'"):
        run_planner("nosuch", problem())


@pytest.mark.parametrize("method", [Method.GPIPE, Method.ONE_F_ONE_B])
@pytest.mark.parametrize("n_micro", [1, 3, 8])
def test_score_is_the_event_simulators_time(method: Method, n_micro: int) -> None:
    c = cost()
    plan = build_balanced_plan(ModelRef.synthetic(NAMES), c, method=method, n_stages=2, batch_size=BATCH,
                               n_micro=n_micro)
    timeline = simulate(build_schedule(plan), plan, c)
    candidate = score(plan, c, label="test 1-1")
    assert candidate.iteration_s == timeline.iteration_s
    prediction = candidate.plan.prediction
    assert prediction is not None and prediction.iteration_s == timeline.iteration_s
    assert prediction.bubble_fraction == timeline.bubble_fraction()
    assert prediction.peak_memory_bytes == timeline.peak_activation_bytes
    assert prediction.basis == "test 1-1, simulated: profile synthetic (cpu), cluster test-2"
    assert candidate.label == "test 1-1" and candidate.cluster is c.cluster and candidate.feasible
    assert dataclasses.replace(candidate.plan, prediction=None) == plan


def test_problem_refuses_what_no_planner_can_plan() -> None:
    with pytest.raises(UserError, match="batch_size is 0"):
        PlanningProblem(ModelRef.synthetic(NAMES), cost(), 0)
    with pytest.raises(UserError, match="has no layers"):
        PlanningProblem(ModelRef.synthetic(()), cost(), BATCH)
    with pytest.raises(UserError):
        PlanningProblem(ModelRef.synthetic(NAMES), cost(), BATCH, optimizer="rmsprop")  # type: ignore[arg-type]


def test_auto_lists_each_runs_runners_up_after_the_winners() -> None:
    """auto's candidates hold every run's winner and then its other feasible plans, so plans of one
    planner within the profile's noise of the winner are seen (planners/noise); the winner is a run's."""
    result = run_planner("auto", problem(Constraints(seed=3, ga=SMALL_GA)))
    report = result.report
    assert isinstance(report, AutoReport)
    winners = [o.plan for o in report.outcomes if o.plan is not None]
    assert result.plan in winners and len(result.candidates) > len(winners)
    assert all(c.feasible for c in result.candidates)
    keys = [rank_key(c) for c in result.candidates]
    assert keys == sorted(keys)
    plans = [c.plan for c in result.candidates]
    assert len(plans) == len({p.to_json() for p in plans})  # each plan once
