"""What ``pipetrain plan`` shows of a planner's result, as data: the parts of its report.

    spec = get_planner(result.planner)
    spec.layout(result)     # (PlanPart(plan), CandidatesPart(candidates, "pipedream candidates"), ...)
    result_tables(result)   # pipetrain.viz.plan_tables renders each part

A planner's :attr:`~pipetrain.planners.spec.PlannerSpec.layout` lays its result out from these parts,
so a new planner shows its plan, candidates and notes without a case of its own in :mod:`pipetrain.viz`.
A planner whose account needs a table of its own (BaPipe's exploration, ``auto``'s planners) puts its
report object itself among the parts, and viz renders that type.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate, PlanningResult

__all__ = ["CandidatesPart", "NotePart", "PlanPart", "default_layout"]


@dataclass(frozen=True)
class PlanPart:
    """The plan's table: per stage its layers, ranks and micro-batch sizes, the prediction below.

    Attributes:
        plan: the plan shown.
        baselines: ``(label, plan)`` pairs it is compared with (a micro-batch plan's equal base).
        caps: per stage, the largest micro-batch memory allows (None: no cap); None without caps.
    """

    plan: Plan
    baselines: tuple[tuple[str, Plan], ...] = ()
    caps: tuple[int | None, ...] | None = None


@dataclass(frozen=True)
class CandidatesPart:
    """The best candidates a planner scored, fastest first, under ``title``."""

    candidates: tuple[Candidate, ...]
    title: str = "planner candidates"


@dataclass(frozen=True)
class NotePart:
    """One line of text (what the planner chose, or why it kept another plan)."""

    text: str


def default_layout(result: PlanningResult) -> tuple[object, ...]:
    """The plan, then every candidate the planner scored."""
    return PlanPart(result.plan), CandidatesPart(result.candidates)
