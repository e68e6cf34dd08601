"""Every planner by name, behind one contract (:mod:`pipetrain.planners.contract`).

    spec = get_planner("pipedream")
    spec.check(constraints)                  # before any profiling: UserError for what it ignores
    result = run_planner("pipedream", problem)

Two kinds of planner:

* **stage planners** choose the stages (layers, ranks, replication), the method and the micro-batches:
  ``balanced``, ``pipedream``, ``bapipe``, ``graphpipe``, ``interleaved``, ``auto``, ``2bw``;
* **micro-batch planners** keep a base plan's stages (``constraints.base``, default the ``balanced``
  planner's best plan) and choose each stage's forward and backward micro-batch sizes (UMPIPE,
  docs/algorithms.md §2): ``equal``, ``greedy``, ``dp``, ``dgap``, ``tidgap``, ``single``, ``1f1b-ga``,
  ``zb1-ga``, ``interleaved-ga`` (whose default base is the ``interleaved`` planner's plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from pipetrain.errors import UserError
from pipetrain.planners.auto import plan_auto
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import plan_bapipe
from pipetrain.planners.contract import Constraints, PlanningProblem, PlanningResult
from pipetrain.planners.graphpipe import plan_graphpipe
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.microbatch import GA_PLANNERS, PLANNER_NAMES, PlannerName
from pipetrain.planners.pipedream import plan_pipedream
from pipetrain.planners.twobw import plan_2bw
from pipetrain.planners.unequal import plan_unequal

__all__ = ["MICROBATCH_PLANNERS", "PLANNERS", "STAGE_PLANNERS", "PlannerKind", "PlannerSpec", "get_planner",
           "run_planner"]

PlannerKind = Literal["stages", "microbatch"]


@dataclass(frozen=True)
class PlannerSpec:
    """One registered planner.

    Attributes:
        name: its registry name (the CLI's ``--planner``).
        kind: ``"stages"`` or ``"microbatch"`` (module docstring).
        summary: one line for help texts.
        accepts: the :class:`Constraints` fields it uses; others are refused by :meth:`check`.
        run: the planner.
    """

    name: str
    kind: PlannerKind
    summary: str
    accepts: frozenset[str]
    run: Callable[[PlanningProblem], PlanningResult]

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


def _microbatch(name: PlannerName) -> PlannerSpec:
    ga = name in GA_PLANNERS
    # n_stages and n_micro shape the balanced base plan when no base is given
    accepts = {"base", "memory_cap", "n_stages", "n_micro", *(("seed", "ga") if ga else ()),
               *(("virtual_stages",) if name == "interleaved-ga" else ())}
    what = {"1f1b-ga": "under the 1F1B order, forward = backward",
            "zb1-ga": "under the ZB-H1 order (backward split into B and W), forward = backward",
            "interleaved-ga": "per virtual stage of an interleaved plan, forward = backward"}.get(
        name, "per stage, forward and backward")
    return PlannerSpec(name, "microbatch", f"UMPIPE micro-batch planner {name!r}: unequal sizes {what}",
                       frozenset(accepts), lambda problem: plan_unequal(problem, name))


def _auto(problem: PlanningProblem) -> PlanningResult:
    if not problem.progress:
        return plan_auto(problem)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return plan_auto(problem, on_planner=lambda step: console.print(f"[dim]auto: running the {step} planner[/dim]"))


_STAGE_SPECS = (
    PlannerSpec("balanced", "stages", "gpipe or 1f1b, an exact min-max layer split, one stage per device",
                frozenset({"method", "n_stages", "n_micro", "memory_cap"}), plan_balanced),
    PlannerSpec("pipedream", "stages", "PipeDream's DP over layers, machines and replication (docs/algorithms.md §3)",
                frozenset({"method"}), plan_pipedream),
    PlannerSpec("bapipe", "stages", "BaPipe's exploration of method, stages, micro-batches and device order "
                "(docs/algorithms.md §4)", frozenset({"n_stages", "seed", "ga"}), plan_bapipe),
    PlannerSpec("graphpipe", "stages", "GraphPipe's SP decomposition, DP and TPS search: a DAG of stages (method "
                "graph) for multi-branch models", frozenset(), plan_graphpipe),
    PlannerSpec("interleaved", "stages", "interleaved 1F1B: v model chunks per rank, looping placement, any "
                "micro-batch count; backward fused (interleaved) or split into B and W (interleaved-zb); "
                "and ZB-V's 2 chunks per rank in a V (zbv)",
                frozenset({"method", "n_micro", "virtual_stages", "memory_cap"}), plan_interleaved),
    PlannerSpec("auto", "stages", "every planner; the fastest plan that fits", frozenset({"seed", "ga", "allow_async"}),
                _auto),
    PlannerSpec("2bw", "stages", "PipeDream-2BW: depth, micro-batch size, recompute (docs/algorithms.md §3.6)",
                frozenset({"method"}), plan_2bw),
)

PLANNERS: Final[dict[str, PlannerSpec]] = {
    spec.name: spec for spec in (*_STAGE_SPECS, *(_microbatch(name) for name in PLANNER_NAMES))
}
"""Every planner, by name: the stage planners first, then the micro-batch planners."""

STAGE_PLANNERS: Final = tuple(name for name, spec in PLANNERS.items() if spec.kind == "stages")
MICROBATCH_PLANNERS: Final = tuple(name for name, spec in PLANNERS.items() if spec.kind == "microbatch")


def get_planner(name: str) -> PlannerSpec:
    """The planner registered as ``name``; a UserError listing the names otherwise."""
    if name not in PLANNERS:
        raise UserError(f"unknown planner {name!r}; choose one of {', '.join(PLANNERS)}")
    return PLANNERS[name]


def run_planner(name: str, problem: PlanningProblem) -> PlanningResult:
    """Check the problem's constraints against planner ``name`` and run it."""
    spec = get_planner(name)
    spec.check(problem.constraints)
    return spec.run(problem)
