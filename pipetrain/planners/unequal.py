"""Micro-batch planners on a base plan's stages: UMPIPE's unequal micro-batches (docs/algorithms.md §2).

    result = run_planner("tidgap", problem)      # base: constraints.base, or the balanced planner's best
    result.plan                                  # method uedp (1f1b for '1f1b-ga', zb1 for 'zb1-ga')
    result.report.baselines                      # what to compare its speedup with

The base plan fixes the stages (layers, ranks) and the batch; the planner
(:data:`~pipetrain.planners.microbatch.PLANNER_NAMES`) chooses each stage's forward and backward
micro-batch sizes. With ``constraints.memory_cap`` every stage's micro-batches stay within its
device's memory (:func:`~pipetrain.planners.microbatch.caps.microbatch_caps`, under the problem's
optimizer), and when some stage cannot keep all ``B`` samples' activations the plan recomputes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from pipetrain.errors import UserError
from pipetrain.plan.methods import Backward
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult
from pipetrain.planners.cut_search import equal_cuts, layer_counts, search_cuts, with_counts
from pipetrain.planners.microbatch import GA_PLANNERS, GAConfig, PlannerName, fits_without_recompute, microbatch_caps
from pipetrain.planners.microbatch.ga import OnGeneration
from pipetrain.planners.microbatch.uedp import plan_uedp
from pipetrain.planners.progress import generation_bar
from pipetrain.planners.recompute import as_chosen
from pipetrain.planners.report import CandidatesPart, NotePart, PlanPart
from pipetrain.planners.spec import BaseRule
from pipetrain.simulate.memory import overflows

__all__ = ["UnequalReport", "plan_unequal", "unequal_layout"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnequalReport:
    """What a micro-batch planner's plan is measured against.

    Attributes:
        caps: per stage, the largest micro-batch memory allows (None: no cap); None without caps.
        baselines: ``(label, plan)`` pairs: the base plan and, when that one overflows some device,
            the best equal partition that fits (recomputing, within the caps).
        base_candidates: the balanced planner's candidates the base was chosen from (empty when the
            base was given).
        kept_baseline: when the micro-batch planner found nothing faster than the baseline that
            fits, a line saying so: the result is then that baseline; else None.
    """

    caps: tuple[int | None, ...] | None
    baselines: tuple[tuple[str, Plan], ...]
    base_candidates: tuple[Candidate, ...]
    kept_baseline: str | None = None


def _base(problem: PlanningProblem, rule: BaseRule) -> tuple[Plan, tuple[Candidate, ...]]:
    """The given base plan, else the fastest plan of the planner ``rule`` names (the balanced planner's;
    the interleaved planner's fused plan for ``interleaved-ga``, whose orders are interleaved 1F1B's),
    with the candidates it was chosen from."""
    given = problem.constraints.base
    if given is not None:
        if given.n_ranks > problem.cost.cluster.n_devices:
            raise UserError(f"the base plan uses {given.n_ranks} ranks but the cluster has "
                            f"{problem.cost.cluster.n_devices}; give the cluster {given.n_ranks} devices")
        fp = given.model_fingerprint
        if any(p.fingerprint and fp and p.fingerprint != fp for p in problem.cost.profiles.values()):
            raise UserError(f"the profile is of another model than the base plan's {given.model!r}; "
                            "profile that model")
        return given, ()
    found = rule.find(problem)
    return rule.pick(found), found.candidates


def _capped(problem: PlanningProblem, base: Plan) -> tuple[Plan, tuple[int | None, ...] | None]:
    """The base (recomputing the stages that cannot keep all activations, or as ``constraints.recompute``
    says) and the memory caps."""
    choice = problem.constraints.recompute
    base = as_chosen(base, choice)
    if not problem.constraints.memory_cap:
        return base, None
    caps = microbatch_caps(base, problem.cost, optimizer=problem.optimizer)
    fits = fits_without_recompute(base, problem.cost, optimizer=problem.optimizer)
    short = [k for k, ok in enumerate(fits) if not ok and not base.stages[k].recompute]
    if short and choice == "auto":
        log.info("stage(s) %s cannot hold all %d samples' activations: planning them with recompute",
                 ", ".join(map(str, short)), problem.batch_size)
        base = base.with_recompute({*base.recompute_stages, *short})
    return base, caps


def plan_unequal(problem: PlanningProblem, planner: PlannerName, base_rule: BaseRule) -> PlanningResult:
    """Run micro-batch planner ``planner`` on the base plan's stages (see the module docstring):
    ``constraints.base``, else the one ``base_rule`` finds."""
    base, base_candidates = _base(problem, base_rule)
    start, caps = _capped(problem, replace(base, prediction=None))  # before the progress bar: it may refuse
    c = problem.constraints
    config = c.ga or GAConfig()
    with generation_bar(planner, config.generations, problem.progress and planner in GA_PLANNERS) as on_generation:
        def run(stages: Plan, ga: GAConfig = config, progress: OnGeneration | None = on_generation) -> Plan:
            begin, limits = (start, caps) if stages is base else _capped(problem, replace(stages, prediction=None))
            return plan_uedp(begin, problem.cost, planner=planner, seed=c.seed, config=ga, caps=limits,
                             on_generation=progress, smallest=problem.smallest_microbatch)

        if config.cut_rounds and planner in GA_PLANNERS and not base.spec.multi_stage:
            screen = replace(config, generations=max(1, config.generations // 10), cut_rounds=0)
            plan = search_cuts(base, run, lambda stages: run(stages, screen, None), rounds=config.cut_rounds,
                               others=equal_cuts(base, (c.plan for c in base_candidates)))
        else:
            plan = run(base)
    _check_memory(plan, problem, _capped(problem, with_counts(base, layer_counts(plan)))[1])
    baselines: tuple[tuple[str, Plan], ...] = (("best equal plan", base),)
    over = overflows(base, problem.cost, optimizer=problem.optimizer) if caps is not None else []
    if over and not base.spec.multi_stage:  # chunks on every rank take no other planner
        fitting = plan_uedp(start, problem.cost, planner="equal", caps=caps, smallest=problem.smallest_microbatch)
        baselines = ((f"best equal plan, over memory on stage {over[0][0]}", base),
                     ("best equal plan within memory", fitting))
    described = f"{planner} (seed {c.seed})" if planner in GA_PLANNERS else planner
    plan, kept = _better(plan, described, baselines[-1])
    assert plan.prediction is not None
    candidate = Candidate(plan, plan.prediction.iteration_s, problem.cost.cluster, planner)
    if kept is not None:
        baselines = baselines[:-1]
    return PlanningResult(planner, plan, problem.cost.cluster, (candidate,),
                          UnequalReport(caps, baselines, base_candidates, kept))


def _better(plan: Plan, planner: str, baseline: tuple[str, Plan]) -> tuple[Plan, str | None]:
    """The planner's plan, or the baseline (that fits) when the planner's is not faster, with a line
    saying so."""
    label, other = baseline
    mine, theirs = plan.prediction, other.prediction
    if mine is None or theirs is None or mine.iteration_s <= theirs.iteration_s:
        return plan, None
    ratio = theirs.iteration_s / mine.iteration_s
    return other, (f"{planner} found nothing faster than the {label} (its best: {ratio:.3f}×): kept the "
                   f"{label} ({other.method.value}), which is what was saved")


def _check_memory(plan: Plan, problem: PlanningProblem, caps: tuple[int | None, ...] | None) -> None:
    """The caps bound each stage alone in a flush schedule; check the plan with the whole memory model
    (:func:`~pipetrain.simulate.memory.overflows`), which also counts what the caps cannot: a rank of an
    interleaved plan holds all its stages at once, and zb1's split backward holds each micro-batch's
    output gradients from its B to its W (:meth:`~pipetrain.cost.CostModel.held_grad_bytes`).

    Raises:
        UserError: the plan does not fit, naming the stage and what to change.
    """
    if caps is None:
        return
    over = overflows(plan, problem.cost, optimizer=problem.optimizer)
    if not over:
        return
    stage, need, room = over[0]
    cause, fix = _overflow_cause(plan)
    raise UserError(f"the {plan.method.value} plan needs {need} bytes on the rank of stage {stage}, which has {room}: "
                    f"{cause}; {fix}, more devices or a smaller batch")


def _overflow_cause(plan: Plan) -> tuple[str, str]:
    """Why a plan within its caps overflows, and what to change, from its method's traits."""
    if plan.spec.multi_stage:
        return "its chunks together do not fit", "use fewer virtual stages (--virtual-stages)"
    if plan.spec.backward is Backward.SPLIT:
        return "the split backward holds gradients from B to W", "use planner 1f1b-ga"
    return "it does not fit", "plan with recompute"


def unequal_layout(result: PlanningResult) -> tuple[object, ...]:
    """The plan beside its baselines and memory caps; why a baseline was kept instead; the base planner's
    candidates."""
    report = result.report
    assert isinstance(report, UnequalReport)
    kept = () if report.kept_baseline is None else (NotePart(report.kept_baseline),)
    base = () if not report.base_candidates else (
        CandidatesPart(report.base_candidates, "equal-micro-batch candidates (the baseline)"),)
    return PlanPart(result.plan, report.baselines, report.caps), *kept, *base
