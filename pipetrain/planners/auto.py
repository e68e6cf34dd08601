"""``--planner auto``: run every planner, keep the fastest plan that fits (docs/architecture.md §4).

    result = run_planner("auto", PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan, result.cluster          # the winner and the cluster its ranks index
    for o in result.report.outcomes: print(o.planner, o.iteration_s, o.note)

auto runs what the registry's specs say (:attr:`~pipetrain.planners.spec.PlannerSpec.auto`,
:data:`~pipetrain.planners.registry.AUTO_RUNS`, in their order), each simulated by the event simulator
on the same cost model:

* ``balanced``: GPipe, 1F1B, ZB-H1 and ZB-H2 (``zb1``, ``zb2``) with an exact min–max layer split and
  equal micro-batches (:func:`~pipetrain.planners.balanced.plan_balanced`), one stage per device, its
  fastest plan that fits (:func:`~pipetrain.planners.balanced.fastest_fitting`);
* ``tidgap``, ``1f1b-ga`` and ``zb1-ga``: UMPIPE's unequal micro-batches (docs/algorithms.md §2) on the
  fastest balanced plan's stages whatever its memory (their :class:`~pipetrain.planners.spec.BaseRule`),
  under memory caps (:func:`~pipetrain.planners.unequal.plan_unequal`), with a GA budget of 48 × 60
  unless the problem gives one;
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
  branchy model gets the better of its linearised chain and its graph (:func:`branching_model`);
* only with ``constraints.allow_async`` (``plan --planner auto --allow-async``), the runs whose plans
  are all asynchronous (docs/algorithms.md §3.5–3.6): ``pipedream-async``, the PipeDream
  DP's steady-state plan run by ``pipedream`` (:func:`~pipetrain.planners.pipedream.async_candidates_at`),
  and ``2bw`` (:func:`~pipetrain.planners.twobw.plan_2bw`). They change the optimizer's semantics
  (stale weights, a step per micro-batch for pipedream), so they compete only when asked; their
  time is the steady-state seconds per batch, and the table marks them.

A plan is feasible when every stage's predicted memory under the problem's optimizer
(:func:`~pipetrain.simulate.memory.memory_need`) fits its device. A planner that finds nothing
feasible is reported with its reason; the fastest feasible plan wins
(:func:`~pipetrain.planners.contract.rank_key`: within 3 significant digits, less activation memory,
then fewer micro-batches, then the earlier run in the list above).

Auto makes the runs whose plans keep each stage on one rank (:attr:`~pipetrain.planners.spec.AutoRun.single_rank`:
the micro-batch runs, ``bapipe``, ``interleaved``) after the others, and skips one when no plan that
keeps each stage on one rank can come within :data:`~pipetrain.planners.auto_bound.BOUND_MARGIN` of
the best plan found (:func:`~pipetrain.planners.auto_bound.single_rank_bound`), noting the bound: such
a run cannot win, so the plan is the same. It matters at scale: gpt1-14 at batch 512 on 512 A100s,
where ``pipedream``'s replicated stages take 0.075 s and no single-rank plan less than 3.9 s, the
skipped runs took 179 of auto's 203 s CPU before (benchmarks/history/plan-scale.md).

With a planning-time budget (``constraints.time_budget_s``; ``pipetrain plan`` without ``--planner``
gives 60 s, :data:`~pipetrain.planners.registry.DEFAULT_TIME_BUDGET_S`) auto makes ``balanced`` and
``interleaved`` first (:attr:`~pipetrain.planners.spec.AutoRun.budget_first`: the base of the
micro-batch runs, and the run whose plans won the Core benchmark's problems), then the others, and
skips those left once the budget is spent and a plan fits, noting each ``skipped: time budget``. On
this 2-core CPU all of auto's synchronous runs took 10.6 s for the 8 × (1024-4096-1024) MLP at batch
128 on 2 calibrated ranks (interleaved 7.9 s of it) and 4.2 s for gpt-tiny at batch 64, at a load
of ≈ 15: the budget cuts only larger problems.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan
from pipetrain.planners.auto_bound import BOUND_MARGIN, single_rank_bound
from pipetrain.planners.contract import Candidate, Constraints, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.report import PlanPart
from pipetrain.planners.score import over_memory
from pipetrain.planners.spec import AutoRun, PlannerSpec

__all__ = ["ASYNC_NOTE", "INTERLEAVED_GA_MAX_BATCH", "SKIPPED_NOTE", "AutoReport", "Outcome", "auto_layout",
           "auto_runs", "branching_model", "plan_auto", "skipped", "small_batch_or_budget"]

log = logging.getLogger(__name__)

INTERLEAVED_GA_MAX_BATCH = 32
"""The largest batch for which auto runs ``interleaved-ga`` without a GA budget given (module docstring)."""
ASYNC_NOTE = "async: changes optimizer semantics"
SKIPPED_NOTE = "skipped: time budget"
"""An outcome's note for a run a planning-time budget left out (``constraints.time_budget_s``)."""
_GA = GAConfig(population=48, generations=60)

Run = tuple[PlannerSpec, AutoRun]
"""A planner and one of auto's runs of it."""


def small_batch_or_budget(problem: PlanningProblem) -> bool:
    """``interleaved-ga``'s :attr:`~pipetrain.planners.spec.AutoRun.when`: a batch of at most
    :data:`INTERLEAVED_GA_MAX_BATCH` samples, or a GA budget given (``constraints.ga``)."""
    return problem.batch_size <= INTERLEAVED_GA_MAX_BATCH or problem.constraints.ga is not None


def branching_model(problem: PlanningProblem) -> bool:
    """``graphpipe``'s :attr:`~pipetrain.planners.spec.AutoRun.when`: a model that branches (``ModelRef.edges``)."""
    return bool(problem.model.edges)


def auto_runs(runs: Sequence[Run], problem: PlanningProblem) -> tuple[Run, ...]:
    """The runs auto makes on ``problem``: those whose ``when`` holds, the asynchronous ones only with
    ``constraints.allow_async``; ``runs`` in auto's order."""
    return tuple((spec, run) for spec, run in runs
                 if run.when(problem) and (problem.constraints.allow_async or not spec.asynchronous(run)))


@dataclass(frozen=True)
class Outcome:
    """One run's answer.

    Attributes:
        planner: the run's label (:attr:`~pipetrain.planners.spec.AutoRun.label`).
        plan: its fastest feasible plan, or None.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it leaves devices idle).
        note: why there is no plan, or what the plan is (method, stages, micro-batches).
        asynchronous: its plans change the optimizer's semantics (``constraints.allow_async`` runs).
        runners_up: the run's other feasible candidates, fastest first (so that plans of one planner
            within the profile's noise of the winner are seen as such, :mod:`~pipetrain.planners.noise`).
    """

    planner: str
    plan: Plan | None
    cluster: Cluster | None
    note: str
    asynchronous: bool = False
    runners_up: tuple[Candidate, ...] = ()

    @property
    def iteration_s(self) -> float:
        return self.plan.prediction.iteration_s if self.plan and self.plan.prediction else float("inf")


@dataclass(frozen=True)
class AutoReport:
    """Every run's outcome, in :func:`auto_runs` order, and the winner's label."""

    outcomes: tuple[Outcome, ...]
    winner: str


def _describe(plan: Plan) -> str:
    layers = "/".join(s.label for s in plan.stages)
    return f"{plan.method.value}, stages {layers}, {len(plan.stages[0].forward_sizes)} micro-batches"


class _Runs:
    """Auto's runs on one problem, each made at most once: a micro-batch planner's base plan comes
    from its base planner's run (:class:`~pipetrain.planners.spec.BaseRule`)."""

    def __init__(self, runs: Sequence[Run], problem: PlanningProblem) -> None:
        self.problem = problem
        self.by_label = {run.label: (spec, run) for spec, run in runs}
        self.results: dict[str, PlanningResult | UserError] = {}

    def result(self, label: str) -> PlanningResult:
        """The planner's result for run ``label`` (before its ``outcome``).

        Raises:
            UserError: the planner's, or its base's, kept for the next run that asks.
        """
        if label not in self.results:
            try:
                self.results[label] = self._make(*self.by_label[label])
            except UserError as e:
                self.results[label] = e
        found = self.results[label]
        if isinstance(found, UserError):
            raise found
        return found

    def _make(self, spec: PlannerSpec, run: AutoRun) -> PlanningResult:
        problem, c = self.problem, self.problem.constraints
        if spec.base is not None:  # on its base planner's fastest plan, with a moderate GA budget
            base = replace(spec.base.pick(self.result(spec.base.planner)), prediction=None)
            ga = Constraints(base=base, seed=c.seed, ga=c.ga or _GA, recompute=c.recompute)
            return spec.run(replace(problem, constraints=ga, progress=False))
        asked = replace(c, allow_async=False, method=run.method if run.method is not None else c.method,
                        memory_cap=c.memory_cap and run.memory_cap, time_budget_s=None)
        return spec.run(replace(problem, constraints=asked))

    def outcome(self, spec: PlannerSpec, run: AutoRun) -> Outcome:
        asynchronous = spec.asynchronous(run)
        try:
            result = self.result(run.label)
            if run.outcome is not None:
                result = run.outcome(result, self.problem)
        except UserError as e:
            return Outcome(run.label, None, None, str(e).split("\n")[0], asynchronous)
        why = over_memory(result.plan, self.problem.cost.on(result.cluster), self.problem.optimizer)
        if why:
            return Outcome(run.label, None, None, f"{_describe(result.plan)}: over memory, {why}", asynchronous)
        others = () if run.outcome is not None else tuple(  # a run that rewrites its plan: its winner alone
            Candidate(c.plan, c.iteration_s, c.cluster or result.cluster, run.label)
            for c in result.candidates if c.feasible and c.plan != result.plan)
        return Outcome(run.label, result.plan, result.cluster, _describe(result.plan), asynchronous, others)


def plan_auto(problem: PlanningProblem, runs: Sequence[Run], on_planner: Callable[[str], None] | None = None,
              clock: Callable[[], float] = time.monotonic) -> PlanningResult:
    """Make every run of ``runs`` that applies (:func:`auto_runs`) and keep the fastest feasible plan.

    Under a planning-time budget (``constraints.time_budget_s``) the runs marked
    :attr:`~pipetrain.planners.spec.AutoRun.budget_first` go first; once the budget is spent and a
    plan that fits is in hand, the runs not yet made are skipped (:data:`SKIPPED_NOTE`). A run is
    never cut short: the budget is checked between runs. The outcomes are listed, and full ties
    broken, in auto's order whatever order the runs were made in, so with nothing skipped the plan
    is auto's.

    Args:
        problem: the model, cost model, batch and optimizer; ``constraints.seed`` seeds the GA planners
            and ``constraints.ga`` sets their budget (default 48 × 60; given, it also runs
            ``interleaved-ga`` for any batch), ``constraints.allow_async`` adds the asynchronous runs,
            ``constraints.time_budget_s`` bounds the planning time.
        runs: every planner's runs in auto's order (:data:`~pipetrain.planners.registry.AUTO_RUNS`).
        on_planner: called with each run's label before it runs (progress).
        clock: seconds, for the budget (a fake one in tests).

    Returns:
        The winner; candidates: each run's plan that fits and its runners-up, fastest first; report:
        an :class:`AutoReport` with every run's outcome.

    Raises:
        UserError: no planner found a plan that fits; the message lists each one's reason.
    """
    made = _Runs(runs, problem)
    applying = auto_runs(runs, problem)
    budget = problem.constraints.time_budget_s
    start = clock()
    outcomes: dict[str, Outcome] = {}
    bound: list[float] = []  # single_rank_bound, once asked for
    for spec, run in _making_order(applying, budget is not None):
        if budget is not None and clock() - start >= budget and any(o.plan for o in outcomes.values()):
            outcomes[run.label] = Outcome(run.label, None, None, SKIPPED_NOTE, spec.asynchronous(run))
            continue
        ruled_out = _ruled_out(problem, outcomes.values(), bound) if run.single_rank else None
        if ruled_out is not None:
            outcomes[run.label] = Outcome(run.label, None, None, ruled_out, spec.asynchronous(run))
            continue
        if on_planner is not None:
            on_planner(run.label)
        outcomes[run.label] = made.outcome(spec, run)
    listed = tuple(outcomes[run.label] for _, run in applying)
    found = [Candidate(o.plan, o.iteration_s, o.cluster, o.planner) for o in listed if o.plan is not None]
    if not found:
        reasons = "; ".join(f"{o.planner}: {o.note}" for o in listed)
        raise UserError(f"no planner found a plan that fits ({reasons}); use a smaller batch, more devices or "
                        "devices with more memory")
    seen = [c.plan for c in found]
    for o in listed:  # after every winner: full ties still go to the winners, in run order
        for c in o.runners_up:
            if c.plan not in seen:
                seen.append(c.plan)
                found.append(c)
    found.sort(key=rank_key)  # stable: full ties go to the earlier run
    best = found[0]
    assert best.cluster is not None
    log.info("auto: %s wins with %.6f s", best.label, best.iteration_s)
    return PlanningResult("auto", best.plan, best.cluster, tuple(found), AutoReport(listed, best.label))


def _ruled_out(problem: PlanningProblem, made: Iterable[Outcome], bound: list[float]) -> str | None:
    """Why a :attr:`~pipetrain.planners.spec.AutoRun.single_rank` run cannot beat the fastest plan
    ``made`` so far, or None when it might; ``bound`` caches the problem's
    :func:`~pipetrain.planners.auto_bound.single_rank_bound`."""
    leader = min(made, key=lambda o: o.iteration_s, default=None)
    if leader is None or leader.plan is None:
        return None
    if not bound:
        bound.append(single_rank_bound(problem.cost, problem.model.layer_names, problem.batch_size))
    if bound[0] <= leader.iteration_s * (1 + BOUND_MARGIN):
        return None
    return f"skipped: its plans take at least {bound[0]:.4g} s, {leader.planner}'s {leader.iteration_s:.4g} s"


def _making_order(runs: Sequence[Run], budget: bool) -> list[Run]:
    """``runs`` in the order auto makes them (stable): under a budget the
    :attr:`~pipetrain.planners.spec.AutoRun.budget_first` ones first; in each group the
    :attr:`~pipetrain.planners.spec.AutoRun.single_rank` ones last, so that a plan that replicates
    stages can rule them out."""
    return sorted(runs, key=lambda pair: (budget and not pair[1].budget_first, pair[1].single_rank))


def skipped(report: AutoReport) -> tuple[str, ...]:
    """The labels of the runs a time budget skipped, in auto's order."""
    return tuple(o.planner for o in report.outcomes if o.note == SKIPPED_NOTE)


def auto_layout(result: PlanningResult) -> tuple[object, ...]:
    """The winner's plan, then every run's outcome beside it (:func:`pipetrain.viz.plan_tables.auto_table`)."""
    return PlanPart(result.plan), result.report
