"""``--planner auto``: run every planner, keep the fastest plan that fits (docs/architecture.md §4).

    result = plan_auto(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan, result.cluster          # the winner and the cluster its ranks index
    for o in result.report.outcomes: print(o.planner, o.iteration_s, o.note)

The planners, each simulated by the event simulator on the same cost model:

* ``balanced``: GPipe, 1F1B and ZB-H1 (``zb1``) with an exact min–max layer split and equal micro-batches
  (:func:`~pipetrain.planners.balanced.plan_balanced`), one stage per device;
* ``tidgap`` and ``1f1b-ga``: UMPIPE's unequal micro-batches (docs/algorithms.md §2) on the balanced plan's
  stages, under memory caps (:func:`~pipetrain.planners.unequal.plan_unequal`);
* ``pipedream``: PipeDream's DP over layers, machines and replication (docs/algorithms.md §3,
  :func:`~pipetrain.planners.pipedream.plan_pipedream`);
* ``bapipe``: BaPipe's exploration of method × stages × micro-batches × device order (docs/algorithms.md §4,
  :func:`~pipetrain.planners.bapipe.explore`);
* ``graphpipe``, for a model that branches (``ModelRef.edges``): GraphPipe's DAG of stages (method
  ``graph``, docs/algorithms.md §5, :func:`~pipetrain.planners.graphpipe.plan_graphpipe`), so a
  branchy model gets the better of its linearised chain and its graph.

A plan is feasible when every stage's predicted memory under the problem's optimizer
(:func:`~pipetrain.simulate.memory.memory_need`) fits its device. A planner that finds nothing
feasible is reported with its reason; the fastest feasible plan wins
(:func:`~pipetrain.planners.contract.rank_key`: within 3 significant digits, less activation memory,
then fewer micro-batches, then the earlier planner in the list above).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import plan_bapipe
from pipetrain.planners.contract import Candidate, Constraints, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.graphpipe import plan_graphpipe
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.planners.score import over_memory
from pipetrain.planners.unequal import plan_unequal

__all__ = ["AUTO_PLANNERS", "AutoReport", "Outcome", "auto_planners", "plan_auto"]

log = logging.getLogger(__name__)

AUTO_PLANNERS = ("balanced", "tidgap", "1f1b-ga", "pipedream", "bapipe", "graphpipe")
"""Every planner auto may run; ``graphpipe`` only for a model that branches (:func:`auto_planners`)."""


def auto_planners(problem: PlanningProblem) -> tuple[str, ...]:
    """The planners auto runs on ``problem``: :data:`AUTO_PLANNERS`, ``graphpipe`` only for a DAG model."""
    return AUTO_PLANNERS if problem.model.edges else AUTO_PLANNERS[:-1]
_GA = GAConfig(population=48, generations=60)


@dataclass(frozen=True)
class Outcome:
    """One planner's answer.

    Attributes:
        planner: its name.
        plan: its fastest feasible plan, or None.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it leaves devices idle).
        note: why there is no plan, or what the plan is (method, stages, micro-batches).
    """

    planner: str
    plan: Plan | None
    cluster: Cluster | None
    note: str

    @property
    def iteration_s(self) -> float:
        return self.plan.prediction.iteration_s if self.plan and self.plan.prediction else float("inf")


@dataclass(frozen=True)
class AutoReport:
    """Every planner's outcome, in :func:`auto_planners` order, and the winner's name."""

    outcomes: tuple[Outcome, ...]
    winner: str


def _describe(plan: Plan) -> str:
    layers = "/".join(s.label for s in plan.stages)
    return f"{plan.method.value}, stages {layers}, {len(plan.stages[0].forward_sizes)} micro-batches"


def _runners(problem: PlanningProblem) -> dict[str, Callable[[], PlanningResult]]:
    """Each planner of :data:`AUTO_PLANNERS` on the problem; the GA planners start from the fastest
    balanced plan's stages with a moderate budget."""
    balanced = plan_balanced(problem)
    fitting = [c for c in balanced.candidates if not over_memory(c.plan, problem.cost, problem.optimizer)]
    base = replace(balanced.plan, prediction=None)
    ga = replace(problem, constraints=Constraints(base=base, seed=problem.constraints.seed, ga=_GA), progress=False)

    def run_balanced() -> PlanningResult:
        if not fitting:
            why = over_memory(balanced.plan, problem.cost, problem.optimizer)
            raise UserError(f"no equal plan on {balanced.plan.n_stages} stages fits: {why}")
        return replace(balanced, plan=fitting[0].plan)

    return {"balanced": run_balanced, "tidgap": lambda: plan_unequal(ga, "tidgap"),
            "1f1b-ga": lambda: plan_unequal(ga, "1f1b-ga"), "pipedream": lambda: plan_pipedream(problem),
            "bapipe": lambda: plan_bapipe(problem), "graphpipe": lambda: plan_graphpipe(problem)}


def _outcome(name: str, run: Callable[[], PlanningResult], problem: PlanningProblem) -> Outcome:
    try:
        result = run()
    except UserError as e:
        return Outcome(name, None, None, str(e).split("\n")[0])
    why = over_memory(result.plan, problem.cost.on(result.cluster), problem.optimizer)
    if why:
        return Outcome(name, None, None, f"{_describe(result.plan)}: over memory, {why}")
    return Outcome(name, result.plan, result.cluster, _describe(result.plan))


def plan_auto(problem: PlanningProblem, on_planner: Callable[[str], None] | None = None) -> PlanningResult:
    """Run every planner of :data:`AUTO_PLANNERS` and keep the fastest feasible plan.

    Args:
        problem: the model, cost model, batch and optimizer; ``constraints.seed`` seeds the GA planners.
        on_planner: called with each planner's name before it runs (progress).

    Returns:
        The winner; candidates: each planner's plan that fits, fastest first; report: an
        :class:`AutoReport` with every planner's outcome.

    Raises:
        UserError: no planner found a plan that fits; the message lists each one's reason.
    """
    runners = _runners(problem)
    outcomes = []
    for name in auto_planners(problem):
        if on_planner is not None:
            on_planner(name)
        outcomes.append(_outcome(name, runners[name], problem))
    found = [Candidate(o.plan, o.iteration_s, o.cluster, o.planner) for o in outcomes if o.plan is not None]
    if not found:
        reasons = "; ".join(f"{o.planner}: {o.note}" for o in outcomes)
        raise UserError(f"no planner found a plan that fits ({reasons}); use a smaller batch, more devices or "
                        "devices with more memory")
    found.sort(key=rank_key)  # stable: full ties go to the earlier planner
    best = found[0]
    assert best.cluster is not None
    log.info("auto: %s wins with %.6f s", best.label, best.iteration_s)
    return PlanningResult("auto", best.plan, best.cluster, tuple(found), AutoReport(tuple(outcomes), best.label))
