"""What the registry knows of a planner: one :class:`PlannerSpec` says everything about it.

    spec = get_planner("pipedream")                        # pipetrain.planners.registry
    spec.methods                                           # (gpipe, 1f1b, pipedream): what its plans run
    spec.plans(METHODS[Method.ZB1])                        # False: a predicate over the method's traits
    [run.label for run in spec.auto]                       # ["pipedream", "pipedream-async"]
    spec.layout(result)                                    # what `pipetrain plan` shows of its result

A planner plugs in by one record in :data:`~pipetrain.planners.registry.PLANNERS`: its contract
(name, the constraints it takes, the function), which methods it plans (read from the methods' traits,
:mod:`pipetrain.plan.methods`, never from their names), whether ``plan --method`` picks it for them,
where a micro-batch planner's base plan comes from (:class:`BaseRule`), how ``auto`` runs it
(:class:`AutoRun`) and how its result is shown (:mod:`pipetrain.planners.report`). The CLI, the API
and ``auto`` read these records and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method, MethodParams, MethodSpec
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Constraints, PlanningProblem, PlanningResult
from pipetrain.planners.report import default_layout

__all__ = ["AutoRun", "BaseRule", "MethodFilter", "PlannerKind", "PlannerSpec", "every_problem", "planned_methods"]

PlannerKind = Literal["stages", "microbatch"]

MethodFilter = Callable[[MethodSpec], bool]
"""A predicate over a method's traits: whether a planner plans it."""


def planned_methods(plans: MethodFilter) -> tuple[Method, ...]:
    """The methods ``plans`` accepts, in :data:`~pipetrain.plan.methods.METHODS` order."""
    return tuple(m for m, spec in METHODS.items() if plans(spec))


def every_problem(problem: PlanningProblem) -> bool:
    """:attr:`AutoRun.when` for a run ``auto`` makes on every problem."""
    return True


@dataclass(frozen=True)
class BaseRule:
    """Where a micro-batch planner's stages come from when the problem gives no base plan
    (``constraints.base``): the fastest plan of a stage planner.

    Attributes:
        planner: the stage planner's registry name (``auto`` reuses its own run of it).
        run: that planner (its :attr:`PlannerSpec.run`).
        method: the method of the plan to start from (its fastest such plan), or None: its fastest plan.
    """

    planner: str
    run: Callable[[PlanningProblem], PlanningResult]
    method: Method | None = None

    def find(self, problem: PlanningProblem) -> PlanningResult:
        """The base planner's result on ``problem``, asked for :attr:`method` and without the memory cap:
        the fastest stages whatever their memory (the micro-batch planner's caps bound its sizes)."""
        return self.run(replace(problem, constraints=replace(problem.constraints, method=self.method,
                                                             memory_cap=False)))

    def pick(self, result: PlanningResult) -> Plan:
        """The fastest plan of :attr:`method` among the base planner's candidates, with its prediction.

        Raises:
            UserError: it found none of that method.
        """
        found = [c.plan for c in result.candidates if self.method is None or c.plan.method is self.method]
        if not found:
            what = "" if self.method is None else f" {self.method.value}"
            raise UserError(f"the {self.planner} planner found no{what} plan to start from")
        return found[0]


@dataclass(frozen=True)
class AutoRun:
    """One of ``auto``'s runs of a planner (:func:`~pipetrain.planners.auto.plan_auto`).

    Attributes:
        label: its name in auto's report: the planner's, or another for a second run
            (``"pipedream-async"``).
        order: auto makes its runs, and lists them, in increasing order; a full tie of two plans
            (:func:`~pipetrain.planners.contract.rank_key`) goes to the earlier.
        when: whether auto makes it on a problem. A run whose plans are all asynchronous
            (:meth:`PlannerSpec.asynchronous`) also needs ``constraints.allow_async``.
        method: the method auto asks the planner for (``constraints.method``); None: its own choice.
        memory_cap: False: auto runs it without the memory cap, so that its ranking whatever the memory
            is the base of the micro-batch planners (whose caps bound their sizes), and takes its
            answer through ``outcome``.
        outcome: how auto takes the planner's answer from its result (the fastest plan that fits, for
            a run without the memory cap); None: the result as it is.
        budget_first: under a planning-time budget (``constraints.time_budget_s``), auto makes the runs
            marked so before the others (each group in :attr:`order`), so that the budget cuts the
            least promising runs (:func:`~pipetrain.planners.auto.plan_auto`).
        single_rank: every plan it returns runs each stage on one rank, so
            :func:`~pipetrain.planners.auto_bound.single_rank_bound` bounds them from below: auto makes
            it after the runs without that mark, and skips it when the bound exceeds the best plan found.
    """

    label: str
    order: int
    when: Callable[[PlanningProblem], bool] = every_problem
    method: Method | None = None
    memory_cap: bool = True
    outcome: Callable[[PlanningResult, PlanningProblem], PlanningResult] | None = None
    budget_first: bool = False
    single_rank: bool = False


@dataclass(frozen=True)
class PlannerSpec:
    """One registered planner.

    Attributes:
        name: its registry name (the CLI's ``--planner``).
        kind: ``"stages"`` (chooses the stages) or ``"microbatch"`` (keeps a base plan's stages and
            chooses the micro-batches; :mod:`pipetrain.planners.registry`).
        summary: one line for help texts.
        accepts: the :class:`~pipetrain.planners.contract.Constraints` fields it uses; others are
            refused by :meth:`check`.
        run: the planner.
        plans: which methods its plans may run, as a predicate over their traits (:attr:`methods`
            lists them).
        default: ``plan --method M`` without ``--planner`` runs it for the methods it plans (the first
            such planner in the registry; :func:`~pipetrain.planners.registry.planner_for`).
        base: a micro-batch planner's base plan when the problem gives none; None for stage planners.
        auto: how ``auto`` runs it; empty: auto leaves it out.
        layout: what ``pipetrain plan`` shows of its result (:mod:`pipetrain.planners.report`).
    """

    name: str
    kind: PlannerKind
    summary: str
    accepts: frozenset[str]
    run: Callable[[PlanningProblem], PlanningResult]
    plans: MethodFilter
    default: bool = False
    base: BaseRule | None = None
    auto: tuple[AutoRun, ...] = ()
    layout: Callable[[PlanningResult], tuple[object, ...]] = default_layout

    @property
    def methods(self) -> tuple[Method, ...]:
        """The methods it plans, in :data:`~pipetrain.plan.methods.METHODS` order."""
        return planned_methods(self.plans)

    def asynchronous(self, run: AutoRun) -> bool:
        """Whether every plan of ``run`` runs without a flush (changing the optimizer's semantics)."""
        methods = self.methods if run.method is None else (run.method,)
        return not any(METHODS[m].flush for m in methods)

    def method_params(self) -> type[MethodParams] | None:
        """The type of the parameters every method it plans takes (:class:`~pipetrain.plan.methods.LocalParams`
        for the local planner), or None when they differ or it plans none."""
        kinds = {METHODS[m].params for m in self.methods}
        return kinds.pop() if len(kinds) == 1 else None

    def implies(self, method: Method) -> bool:
        """Whether ``method`` is the only one it plans and it takes no method: asking for it says nothing."""
        return "method" not in self.accepts and self.methods == (method,)

    def ignored(self, constraints: Constraints) -> tuple[str, ...]:
        """The constraints set away from their defaults that this planner does not use."""
        return tuple(name for name in constraints.given() if name not in self.accepts)

    def check(self, constraints: Constraints) -> None:
        """Refuse constraints this planner would ignore, naming them and what to do."""
        ignored = self.ignored(constraints)
        if ignored:
            raise UserError(f"the {self.name} planner chooses {', '.join(ignored)} itself or does not use "
                            f"{'it' if len(ignored) == 1 else 'them'}; leave {', '.join(ignored)} unset, or use a "
                            f"planner that takes {'it' if len(ignored) == 1 else 'them'} (see pipetrain.planners."
                            "registry.PLANNERS)")
