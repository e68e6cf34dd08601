"""``--planner auto``: run every planner, keep the fastest plan that fits (docs/architecture.md §4).

    result = plan_auto(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan, result.cluster          # the winner and the cluster its ranks index
    for o in result.report.outcomes: print(o.planner, o.iteration_s, o.note)

The planners, each simulated by the event simulator on the same cost model:

* ``balanced``: GPipe, 1F1B and ZB-H1 (``zb1``) with an exact min–max layer split and equal micro-batches
  (:func:`~pipetrain.planners.balanced.plan_balanced`), one stage per device;
* ``tidgap``, ``1f1b-ga`` and ``zb1-ga``: UMPIPE's unequal micro-batches (docs/algorithms.md §2) on the
  balanced plan's stages, under memory caps (:func:`~pipetrain.planners.unequal.plan_unequal`);
* ``pipedream``: PipeDream's DP over layers, machines and replication (docs/algorithms.md §3,
  :func:`~pipetrain.planners.pipedream.plan_pipedream`);
* ``bapipe``: BaPipe's exploration of method × stages × micro-batches × device order (docs/algorithms.md §4,
  :func:`~pipetrain.planners.bapipe.explore`);
* ``interleaved``: interleaved 1F1B, ``v`` chunks per rank, backward fused or split (``interleaved-zb``),
  and ZB-V (``zbv``, 2 chunks per rank in a V) (:func:`~pipetrain.planners.interleaved.plan_interleaved`);
* ``interleaved-ga``: UMPIPE's unequal micro-batches per virtual stage (Narayanan et al. 2021 §2.2's
  order; docs/algorithms.md §6c) on the ``interleaved`` planner's fastest fused (``interleaved``) plan,
  which that planner's run already found (:func:`~pipetrain.planners.unequal.plan_unequal`). Its GA is
  auto's most expensive planner: on this 2-core CPU with estimated V100 profiles it added 0.6 s to
  auto's 1.9 s for gpt-tiny on 2 devices at B = 32, 2.6 s to 7.9 s for gpt1-14 on 4 at B = 64 and
  7.6 s to 27 s for gpt1-14 on 8 at B = 128 (and 0.6–0.9 s, about doubling auto, on the unit tests'
  synthetic 10-layer models at B ≤ 16), and won none of those. So auto runs it only for a batch of at
  most :data:`INTERLEAVED_GA_MAX_BATCH` samples, or when the user asks for the search by giving a GA
  budget (``constraints.ga``; ``plan --planner auto --population P --generations G``);
* ``graphpipe``, for a model that branches (``ModelRef.edges``): GraphPipe's DAG of stages (method
  ``graph``, docs/algorithms.md §5, :func:`~pipetrain.planners.graphpipe.plan_graphpipe`), so a
  branchy model gets the better of its linearised chain and its graph;
* only with ``constraints.allow_async`` (``plan --planner auto --allow-async``), the asynchronous
  methods of :data:`ASYNC_AUTO_PLANNERS` (docs/algorithms.md §3.5–3.6): ``pipedream-async``, the PipeDream
  DP's steady-state plan run by ``pipedream`` (:func:`~pipetrain.planners.pipedream.async_candidates_at`),
  and ``2bw`` (:func:`~pipetrain.planners.twobw.plan_2bw`). They change the optimizer's semantics
  (stale weights, a step per micro-batch for pipedream), so they compete only when asked; their
  time is the steady-state seconds per batch, and the table marks them.

A plan is feasible when every stage's predicted memory under the problem's optimizer
(:func:`~pipetrain.simulate.memory.memory_need`) fits its device. A planner that finds nothing
feasible is reported with its reason; the fastest feasible plan wins
(:func:`~pipetrain.planners.contract.rank_key`: within 3 significant digits, less activation memory,
then fewer micro-batches, then the earlier planner in the list above).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import plan_bapipe
from pipetrain.planners.contract import Candidate, Constraints, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.graphpipe import plan_graphpipe
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.planners.score import memory_checked, over_memory
from pipetrain.planners.twobw import plan_2bw
from pipetrain.planners.unequal import plan_unequal

__all__ = ["ASYNC_AUTO_PLANNERS", "ASYNC_NOTE", "AUTO_PLANNERS", "INTERLEAVED_GA_MAX_BATCH", "AutoReport", "Outcome",
           "auto_planners", "plan_auto"]

log = logging.getLogger(__name__)

AUTO_PLANNERS = ("balanced", "tidgap", "1f1b-ga", "zb1-ga", "pipedream", "bapipe", "interleaved", "interleaved-ga",
                 "graphpipe")
"""Every synchronous planner auto may run; ``interleaved-ga`` only for a small batch or a given GA budget,
``graphpipe`` only for a model that branches (:func:`auto_planners`)."""
INTERLEAVED_GA_MAX_BATCH = 32
"""The largest batch for which auto runs ``interleaved-ga`` without a GA budget given (module docstring)."""
ASYNC_AUTO_PLANNERS = ("pipedream-async", "2bw")
"""The asynchronous candidates ``auto`` adds with ``constraints.allow_async``."""
ASYNC_NOTE = "async: changes optimizer semantics"


def auto_planners(problem: PlanningProblem) -> tuple[str, ...]:
    """The planners auto runs on ``problem``: :data:`AUTO_PLANNERS` (``interleaved-ga`` only for a
    batch of at most :data:`INTERLEAVED_GA_MAX_BATCH` or with ``constraints.ga``, ``graphpipe`` only
    for a DAG model), then :data:`ASYNC_AUTO_PLANNERS` when ``constraints.allow_async``."""
    search = problem.batch_size <= INTERLEAVED_GA_MAX_BATCH or problem.constraints.ga is not None
    skipped = {*(() if search else ("interleaved-ga",)), *(() if problem.model.edges else ("graphpipe",))}
    sync = tuple(p for p in AUTO_PLANNERS if p not in skipped)
    return (*sync, *(ASYNC_AUTO_PLANNERS if problem.constraints.allow_async else ()))
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

    @property
    def asynchronous(self) -> bool:
        """Whether this is one of :data:`ASYNC_AUTO_PLANNERS` (its plan changes the optimizer's semantics)."""
        return self.planner in ASYNC_AUTO_PLANNERS


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
    balanced = plan_balanced(replace(problem, constraints=replace(problem.constraints, memory_cap=False)))
    fitting = [c for c in balanced.candidates if memory_checked(c, problem.cost, problem.optimizer).feasible]
    base = replace(balanced.plan, prediction=None)
    budget = problem.constraints.ga or _GA
    ga = replace(problem, constraints=Constraints(base=base, seed=problem.constraints.seed, ga=budget), progress=False)

    def run_balanced() -> PlanningResult:
        if not fitting:
            why = over_memory(balanced.plan, problem.cost, problem.optimizer)
            raise UserError(f"no equal plan on {balanced.plan.n_stages} stages fits: {why}")
        return replace(balanced, plan=fitting[0].plan)

    sync = replace(problem, constraints=replace(problem.constraints, allow_async=False))
    pipedream_async = replace(sync, constraints=replace(sync.constraints, method=Method.PIPEDREAM))
    interleaved = functools.cache(functools.partial(plan_interleaved, sync))  # interleaved-ga's base too
    return {"balanced": run_balanced, "tidgap": lambda: plan_unequal(ga, "tidgap"),
            "1f1b-ga": lambda: plan_unequal(ga, "1f1b-ga"), "zb1-ga": lambda: plan_unequal(ga, "zb1-ga"),
            "pipedream": lambda: plan_pipedream(sync),
            "bapipe": lambda: plan_bapipe(sync), "interleaved": interleaved,
            "interleaved-ga": lambda: _interleaved_ga(ga, interleaved()),
            "graphpipe": lambda: plan_graphpipe(sync), "pipedream-async": lambda: plan_pipedream(pipedream_async),
            "2bw": lambda: plan_2bw(sync)}


def _interleaved_ga(ga: PlanningProblem, interleaved: PlanningResult) -> PlanningResult:
    """The ``interleaved-ga`` planner on the fastest fused interleaved plan of ``interleaved`` (the
    interleaved planner's result; its orders are interleaved 1F1B's, not interleaved-zb's)."""
    fused = [c.plan for c in interleaved.candidates if c.plan.method is Method.INTERLEAVED]
    if not fused:
        raise UserError("the interleaved planner found no interleaved (fused backward) plan to start from")
    base = replace(fused[0], prediction=None)
    return plan_unequal(replace(ga, constraints=replace(ga.constraints, base=base)), "interleaved-ga")


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
        problem: the model, cost model, batch and optimizer; ``constraints.seed`` seeds the GA planners
            and ``constraints.ga`` sets their budget (default 48 × 60; given, it also runs
            ``interleaved-ga`` for any batch), ``constraints.allow_async`` adds :data:`ASYNC_AUTO_PLANNERS`.
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
