"""UEDP plans: run a micro-batch planner on a chain plan's stages and return a ``uedp`` Plan.

Planner ``1f1b-ga`` (pipetrain's extension) returns a ``1f1b`` plan instead: per-stage unequal
micro-batches, the same for forward and backward, under the 1F1B order; planner ``zb1-ga`` a ``zb1``
plan: the same under the ZB-H1 order (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024);
planner ``interleaved-ga`` keeps an ``interleaved`` base plan's looping stages (Narayanan et al.,
SC'21) and gives each its own partition.

The stages (layers, ranks, recompute), batch come from a base plan, e.g. the equal planner's
(:func:`pipetrain.planners.balanced.plan_balanced`); only the per-stage size vectors change. The chosen plan
is scored once (:func:`~pipetrain.planners.score.score`) to fill its :class:`~pipetrain.plan.plan.Prediction`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal, get_args

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.microbatch.dp import global_dp
from pipetrain.planners.microbatch.equal import best_equal
from pipetrain.planners.microbatch.ga import (
    GAConfig,
    OnGeneration,
    dgap,
    interleaved_ga,
    one_f_one_b_ga,
    single_chromosome,
    tidgap,
    zb1_ga,
)
from pipetrain.planners.microbatch.greedy import local_greedy
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.planners.score import score
from pipetrain.simulate.vectorised import StageTables

__all__ = ["ALGORITHMS", "GA_PLANNERS", "PLANNER_NAMES", "MicrobatchAlgorithm", "PlannerName", "plan_uedp",
           "run_microbatch_planner", "with_sizes"]

log = logging.getLogger(__name__)

PlannerName = Literal["equal", "greedy", "dp", "dgap", "tidgap", "single", "1f1b-ga", "zb1-ga", "interleaved-ga"]


@dataclass(frozen=True)
class MicrobatchAlgorithm:
    """One micro-batch planner (:func:`run_microbatch_planner` runs it by name).

    Attributes:
        method: the method whose order it times, which its plan then runs: UMPIPE's flush order
            (``uedp``, each stage its own forward and backward partition), or pipetrain's extensions
            to another order (forward = backward per stage).
        ga: a genetic algorithm: it takes a seed, a :class:`GAConfig` and ``on_generation``.
        what: how its sizes differ, for help texts.
    """

    method: Method
    ga: bool
    what: str = "per stage, forward and backward"


ALGORITHMS: Mapping[str, MicrobatchAlgorithm] = MappingProxyType({
    "equal": MicrobatchAlgorithm(Method.UEDP, False),
    "greedy": MicrobatchAlgorithm(Method.UEDP, False),
    "dp": MicrobatchAlgorithm(Method.UEDP, False),
    "dgap": MicrobatchAlgorithm(Method.UEDP, True),
    "tidgap": MicrobatchAlgorithm(Method.UEDP, True),
    "single": MicrobatchAlgorithm(Method.UEDP, True),
    "1f1b-ga": MicrobatchAlgorithm(Method.ONE_F_ONE_B, True, "under the 1F1B order, forward = backward"),
    "zb1-ga": MicrobatchAlgorithm(Method.ZB1, True, "under the ZB-H1 order (backward split into B and W), "
                                                   "forward = backward"),
    "interleaved-ga": MicrobatchAlgorithm(Method.INTERLEAVED, True,
                                          "per virtual stage of an interleaved plan, forward = backward"),
})
"""Every micro-batch planner of :data:`PLANNER_NAMES`, by name."""
PLANNER_NAMES: tuple[PlannerName, ...] = get_args(PlannerName)
GA_PLANNERS: tuple[PlannerName, ...] = tuple(name for name in PLANNER_NAMES if ALGORITHMS[name].ga)
"""The planners that are genetic algorithms: they take a seed, a GAConfig and ``on_generation``."""


def run_microbatch_planner(
    name: PlannerName,
    tables: StageTables,
    *,
    seed: int = 0,
    config: GAConfig | None = None,
    caps: Sequence[int] | None = None,
    on_generation: OnGeneration | None = None,
    n_ranks: int | None = None,
) -> MicrobatchPlan:
    """Run one planner by its CLI name (``seed``, ``config``, ``on_generation``: GA planners only;
    ``n_ranks``: the ranks an ``interleaved-ga`` plan's stages loop over).

    Raises:
        ValueError: an unknown name, or ``interleaved-ga`` without ``n_ranks``.
    """
    if name == "equal":
        return best_equal(tables, caps)
    if name == "greedy":
        return local_greedy(tables, caps)
    if name == "dp":
        return global_dp(tables, caps)
    if name == "interleaved-ga":
        if n_ranks is None:
            raise ValueError("planner interleaved-ga needs n_ranks: the ranks the stages loop over (plan.n_ranks)")
        return interleaved_ga(tables, n_ranks, seed=seed, config=config, caps=caps, on_generation=on_generation)
    ga_planners = {"dgap": dgap, "tidgap": tidgap, "single": single_chromosome, "1f1b-ga": one_f_one_b_ga,
                   "zb1-ga": zb1_ga}
    if name not in ga_planners:
        raise ValueError(f"unknown micro-batch planner {name!r}; choose one of {', '.join(PLANNER_NAMES)}")
    return ga_planners[name](tables, seed=seed, config=config, caps=caps, on_generation=on_generation)


def with_sizes(base: Plan, result: MicrobatchPlan) -> Plan:
    """``base`` with ``result``'s per-stage forward and backward sizes and no prediction, run by the
    method of the planner that chose them (:data:`ALGORITHMS`: ``uedp``, or ``1f1b`` for ``1f1b-ga``,
    ``zb1`` for ``zb1-ga``, ``interleaved`` for ``interleaved-ga``)."""
    stages = tuple(
        replace(stage, forward_sizes=fwd, backward_sizes=bwd)
        for stage, fwd, bwd in zip(base.stages, result.forward_sizes, result.backward_sizes, strict=True)
    )
    return replace(base, method=ALGORITHMS[result.planner].method, stages=stages, prediction=None)


def plan_uedp(
    base: Plan,
    cost: CostModel,
    *,
    planner: PlannerName = "tidgap",
    seed: int = 0,
    config: GAConfig | None = None,
    caps: Sequence[int | None] | None = None,
    on_generation: OnGeneration | None = None,
    smallest: int = 1,
) -> Plan:
    """The base plan's stages with the planner's per-stage forward and backward sizes, method ``uedp``
    (``1f1b`` for planner ``1f1b-ga``, ``zb1`` for ``zb1-ga``, ``interleaved`` for ``interleaved-ga``).

    Args:
        base: a chain plan with one rank per stage; its sizes and method are replaced.
        cost: the cost model (tables are built as :meth:`StageTables.from_plan`).
        planner: which planner (see :func:`run_microbatch_planner`).
        seed: GA seed.
        config: GA hyperparameters.
        caps: per stage, the largest micro-batch allowed (a memory limit, e.g.
            :func:`~pipetrain.planners.microbatch.caps.microbatch_caps`); None for no cap, on a stage
            or on all.
        on_generation: GA progress callback ``(generation, best_s)``.
        smallest: the fewest samples a micro-batch may have (a model with BatchNorm that cannot
            train on one: 2); a planner's plan with a smaller one gives way to the best equal plan
            of such micro-batches.

    Raises:
        UserError: ``interleaved-ga`` on a base that is not interleaved, or another planner on one that is.

    Note:
        A stage whose backward sizes differ from its forward sizes recomputes (docs/algorithms.md §2.6,
        :meth:`Plan.recomputes`); the tables cost that wherever a planner chooses it, and a stage's
        backward as recompute where the base plan's stage sets ``recompute``.
    """
    _check_base(planner, base)
    tables = StageTables.from_plan(base, cost)
    limits = None if caps is None or all(c is None for c in caps) else [
        base.batch_size if c is None else c for c in caps
    ]
    result = run_microbatch_planner(planner, tables, seed=seed, config=config, caps=limits, on_generation=on_generation,
                                    n_ranks=base.n_ranks)
    if min(min(sizes) for sizes in (*result.forward_sizes, *result.backward_sizes)) < smallest:
        log.info("%s cut micro-batches below %d samples, which the model's BatchNorm cannot train on: kept the best "
                 "equal plan", result.planner, smallest)
        result = replace(best_equal(tables, limits, smallest), planner=result.planner)
    label = f"{result.planner}{f' (seed {seed})' if planner in GA_PLANNERS else ''}"
    scored = score(with_sizes(base, result), cost, label=label)
    log.debug("%s predicted %.9f s, event simulator %.9f s", result.planner, result.iteration_s, scored.iteration_s)
    return scored.plan


def _check_base(planner: PlannerName, base: Plan) -> None:
    """Refuse a base plan the planner's method cannot run (see :func:`plan_uedp`)."""
    method = METHODS[ALGORITHMS[planner].method]
    if base.placement is not method.placement:
        alike = " or ".join(m.value for m, s in METHODS.items() if s.placement is method.placement and s.flush)
        raise UserError(f"planner {planner} cannot keep the base plan's {base.method.value} stages "
                        f"({base.placement.value} placement): it plans method {method.name} and needs a base plan "
                        f"of method {alike} ({method.placement.value} placement); choose the matching pair")
