"""Every planner by name, behind one contract (:mod:`pipetrain.planners.contract`), each described by
one :class:`~pipetrain.planners.spec.PlannerSpec`.

    spec = get_planner("pipedream")
    spec.check(constraints)                  # before any profiling: UserError for what it ignores
    result = run_planner("pipedream", problem)
    planner_for(Method.GRAPH).name           # "graphpipe": the planner `plan --method graph` runs

Two kinds of planner:

* **stage planners** choose the stages (layers, ranks, replication), the method and the micro-batches:
  ``balanced``, ``pipedream``, ``bapipe``, ``graphpipe``, ``interleaved``, ``auto``, ``2bw``, ``local``;
* **micro-batch planners** keep a base plan's stages (``constraints.base``, default the plan their
  :class:`~pipetrain.planners.spec.BaseRule` names: the ``balanced`` planner's best) and choose each
  stage's forward and backward micro-batch sizes (UMPIPE, docs/algorithms.md §2): ``equal``,
  ``greedy``, ``dp``, ``dgap``, ``tidgap``, ``single``, ``1f1b-ga``, ``zb1-ga``, ``interleaved-ga``
  (whose base is the ``interleaved`` planner's fused plan).

Which methods each plans (a predicate over their traits), and how ``auto`` runs it::

    planner         methods                                     default for   auto runs
    balanced        gpipe, 1f1b, zb1, zb2                        them          balanced (uncapped base)
    pipedream       gpipe, 1f1b, pipedream                       -             pipedream; pipedream-async
    bapipe          gpipe, 1f1b, uedp                            -             bapipe
    graphpipe       graph                                        graph         graphpipe (a branching model)
    interleaved     interleaved, interleaved-zb, zbv             them          interleaved
    auto            what its runs plan                           -             -
    2bw             2bw                                          -             2bw (asynchronous)
    local           local                                        local         -
    tidgap, ...     uedp (1f1b-ga: 1f1b, zb1-ga: zb1,            tidgap: uedp  tidgap, 1f1b-ga, zb1-ga;
                    interleaved-ga: interleaved)                               interleaved-ga (a small batch)
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Final

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method, MethodSpec
from pipetrain.planners.auto import Run, auto_layout, auto_runs, branching_model, plan_auto, small_batch_or_budget
from pipetrain.planners.balanced import balanced_plans, fastest_fitting, plan_balanced
from pipetrain.planners.bapipe import bapipe_layout, bapipe_plans, plan_bapipe
from pipetrain.planners.contract import Constraints, PlanningProblem, PlanningResult
from pipetrain.planners.graphpipe import graphpipe_plans, plan_graphpipe
from pipetrain.planners.interleaved import interleaved_plans, plan_interleaved
from pipetrain.planners.local import local_layout, local_plans, plan_local
from pipetrain.planners.microbatch import ALGORITHMS, PlannerName
from pipetrain.planners.pipedream import pipedream_layout, pipedream_plans, plan_pipedream
from pipetrain.planners.spec import AutoRun, BaseRule, PlannerKind, PlannerSpec
from pipetrain.planners.twobw import plan_2bw, twobw_plans
from pipetrain.planners.unequal import plan_unequal, unequal_layout

__all__ = ["ASYNC_AUTO_PLANNERS", "AUTO_PLANNERS", "AUTO_RUNS", "BASE_PLANNER", "DEFAULT_PLANNER",
           "DEFAULT_TIME_BUDGET_S", "MICROBATCH_PLANNERS", "PLANNERS",
           "STAGE_PLANNERS", "PlannerKind", "PlannerSpec", "auto_planners", "constraints_for", "default_planner",
           "get_planner", "planner_for", "run_planner"]

BASE_PLANNER = "balanced"
"""The micro-batch planners' base, and :func:`planner_for` a problem that names neither a planner nor a
method (``api.plan``: an exact min-max split, milliseconds)."""
DEFAULT_PLANNER = "auto"
"""The planner of ``pipetrain plan`` given neither ``--planner`` nor ``--method``: auto's synchronous runs
within :data:`DEFAULT_TIME_BUDGET_S` (``constraints.time_budget_s``), so the default plan is auto's
wherever auto fits the budget (:func:`~pipetrain.planners.auto.plan_auto`)."""
DEFAULT_TIME_BUDGET_S = 60.0
"""The planning-time budget of :data:`DEFAULT_PLANNER` in seconds."""


def _auto(problem: PlanningProblem) -> PlanningResult:
    if not problem.progress:
        return plan_auto(problem, AUTO_RUNS)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return plan_auto(problem, AUTO_RUNS,
                     on_planner=lambda step: console.print(f"[dim]auto: running the {step} planner[/dim]"))


def _auto_plans(spec: MethodSpec) -> bool:
    """auto plans what its runs plan."""
    return any(planner.plans(spec) for planner, _ in AUTO_RUNS)


_STAGE_SPECS = (
    PlannerSpec("balanced", "stages", "gpipe, 1f1b, zb1 or zb2, an exact min-max layer split, one stage per device",
                frozenset({"method", "n_stages", "n_micro", "memory_cap", "recompute"}), plan_balanced, balanced_plans,
                default=True,
                auto=(AutoRun("balanced", 10, memory_cap=False, outcome=fastest_fitting, budget_first=True),)),
    PlannerSpec("pipedream", "stages", "PipeDream's DP over layers, machines and replication (docs/algorithms.md §3)",
                frozenset({"method"}), plan_pipedream, pipedream_plans, layout=pipedream_layout,
                auto=(AutoRun("pipedream", 50), AutoRun("pipedream-async", 100, method=Method.PIPEDREAM))),
    PlannerSpec("bapipe", "stages", "BaPipe's exploration of method, stages, micro-batches and device order "
                "(docs/algorithms.md §4)", frozenset({"n_stages", "seed", "ga"}), plan_bapipe, bapipe_plans,
                layout=bapipe_layout, auto=(AutoRun("bapipe", 60, single_rank=True),)),
    PlannerSpec("graphpipe", "stages", "GraphPipe's SP decomposition, DP and TPS search: a DAG of stages (method "
                "graph) for multi-branch models", frozenset({"recompute"}), plan_graphpipe, graphpipe_plans,
                default=True, auto=(AutoRun("graphpipe", 90, when=branching_model),)),
    PlannerSpec("interleaved", "stages", "interleaved 1F1B: v model chunks per rank, looping placement, any "
                "micro-batch count; backward fused (interleaved) or split into B and W (interleaved-zb); "
                "and ZB-V's 2 chunks per rank in a V (zbv)",
                frozenset({"method", "n_micro", "virtual_stages", "memory_cap", "recompute"}), plan_interleaved,
                interleaved_plans,
                default=True, auto=(AutoRun("interleaved", 70, budget_first=True, single_rank=True),)),
    PlannerSpec("auto", "stages", "every planner; the fastest plan that fits",
                frozenset({"seed", "ga", "allow_async", "recompute", "time_budget_s"}),
                _auto, _auto_plans, layout=auto_layout),
    PlannerSpec("2bw", "stages", "PipeDream-2BW: width × depth, micro-batch size, recompute (docs/algorithms.md §3.6)",
                frozenset({"method"}), plan_2bw, twobw_plans, auto=(AutoRun("2bw", 110),)),
    PlannerSpec("local", "stages", "PPLL's local learning: stages balanced with their auxiliary heads' time "
                "(docs/algorithms.md §6)", frozenset({"n_stages", "n_micro", "params"}), plan_local, local_plans,
                default=True, layout=local_layout),
)
_STAGE_PLANNERS = {spec.name: spec for spec in _STAGE_SPECS}


def _plans_only(method: Method, spec: MethodSpec) -> bool:
    return spec.method is method


def _microbatch(name: PlannerName, *, default: bool = False, base: str = BASE_PLANNER, own_method: bool = False,
                auto: AutoRun | None = None) -> PlannerSpec:
    """Micro-batch planner ``name`` (:data:`~pipetrain.planners.microbatch.ALGORITHMS`) on the fastest plan of
    stage planner ``base``, of any method, or with ``own_method`` of the method the micro-batch planner runs."""
    algorithm = ALGORITHMS[name]
    rule = BaseRule(base, _STAGE_PLANNERS[base].run, algorithm.method if own_method else None)
    # n_stages, n_micro (and virtual_stages) shape the base plan when no base is given
    accepts = {"base", "memory_cap", "recompute", "n_stages", "n_micro", *(("seed", "ga") if algorithm.ga else ()),
               *(("virtual_stages",) if "virtual_stages" in _STAGE_PLANNERS[base].accepts else ())}
    return PlannerSpec(name, "microbatch", f"UMPIPE micro-batch planner {name!r}: unequal sizes {algorithm.what}",
                       frozenset(accepts), partial(plan_unequal, planner=name, base_rule=rule),
                       partial(_plans_only, algorithm.method), default=default, base=rule,
                       auto=() if auto is None else (auto,), layout=unequal_layout)


_MICROBATCH_SPECS = (
    _microbatch("equal"), _microbatch("greedy"), _microbatch("dp"), _microbatch("dgap"),
    _microbatch("tidgap", default=True, auto=AutoRun("tidgap", 20, single_rank=True)),
    _microbatch("single"),
    _microbatch("1f1b-ga", auto=AutoRun("1f1b-ga", 30, single_rank=True)),
    _microbatch("zb1-ga", auto=AutoRun("zb1-ga", 40, single_rank=True)),
    # interleaved 1F1B's order, on the interleaved planner's fastest plan of that order (not interleaved-zb's)
    _microbatch("interleaved-ga", base="interleaved", own_method=True,
                auto=AutoRun("interleaved-ga", 80, when=small_batch_or_budget, single_rank=True)),
)

PLANNERS: Final[dict[str, PlannerSpec]] = {spec.name: spec for spec in (*_STAGE_SPECS, *_MICROBATCH_SPECS)}
"""Every planner, by name: the stage planners first, then the micro-batch planners."""

STAGE_PLANNERS: Final = tuple(name for name, spec in PLANNERS.items() if spec.kind == "stages")
MICROBATCH_PLANNERS: Final = tuple(name for name, spec in PLANNERS.items() if spec.kind == "microbatch")

AUTO_RUNS: Final[tuple[Run, ...]] = tuple(sorted(
    ((spec, run) for spec in PLANNERS.values() for run in spec.auto), key=lambda pair: pair[1].order))
"""Every run ``auto`` may make, in its order (:attr:`~pipetrain.planners.spec.AutoRun.order`)."""
AUTO_PLANNERS: Final = tuple(run.label for spec, run in AUTO_RUNS if not spec.asynchronous(run))
"""The labels of auto's synchronous runs, in its order."""
ASYNC_AUTO_PLANNERS: Final = tuple(run.label for spec, run in AUTO_RUNS if spec.asynchronous(run))
"""The labels of auto's asynchronous runs (``constraints.allow_async`` only), in its order."""


def get_planner(name: str) -> PlannerSpec:
    """The planner registered as ``name``; a UserError listing the names otherwise."""
    if name not in PLANNERS:
        raise UserError(f"unknown planner {name!r}; choose one of {', '.join(PLANNERS)}")
    return PLANNERS[name]


def default_planner(kind: PlannerKind) -> PlannerSpec:
    """The first default planner of ``kind``: ``balanced`` for stages, ``tidgap`` for micro-batches (the
    planner of a problem with a base plan and no method)."""
    return next(p for p in PLANNERS.values() if p.kind == kind and p.default)


def planner_for(method: Method | None) -> PlannerSpec:
    """The planner that plans ``method`` when none is named: among the planners that can be asked for it
    (they take a method, or plan it alone), the first default one, else the first (``pipedream``, ``2bw``:
    their own planners); :data:`BASE_PLANNER` for no method."""
    if method is None:
        return PLANNERS[BASE_PLANNER]
    asked = [p for p in PLANNERS.values() if p.plans(METHODS[method]) and ("method" in p.accepts or p.implies(method))]
    if not asked:
        raise UserError(f"no planner plans method {method.value}; write its plan by hand (docs/formats.md)")
    return next((p for p in asked if p.default), asked[0])


def constraints_for(spec: PlannerSpec, constraints: Constraints) -> Constraints:
    """``constraints`` as planner ``spec`` takes them: a method it plans alone and takes no choice of
    (graphpipe's ``graph``, ``tidgap``'s ``uedp``) says nothing and is dropped."""
    method = constraints.method
    return replace(constraints, method=None) if method is not None and spec.implies(method) else constraints


def run_planner(name: str, problem: PlanningProblem) -> PlanningResult:
    """Check the problem's constraints against planner ``name`` and run it."""
    spec = get_planner(name)
    spec.check(problem.constraints)
    return spec.run(problem)


def auto_planners(problem: PlanningProblem) -> tuple[str, ...]:
    """The labels of the runs ``auto`` makes on ``problem``, in its order
    (:func:`~pipetrain.planners.auto.auto_runs`)."""
    return tuple(run.label for _, run in auto_runs(AUTO_RUNS, problem))
