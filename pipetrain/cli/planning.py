"""``pipetrain plan``: the planner its flags select (:mod:`pipetrain.cli.routing`), its constraints,
:func:`pipetrain.api.plan`, then the plan file and the planner's tables.

    route, constraints = plan_request(args)          # before the model loads: a bad flag fails first
    result, profile, cluster = plan_model(args, graph, route, constraints)

Without ``--planner`` and ``--method`` the planner is ``auto`` within a planning-time budget
(``--time-budget``, default :data:`~pipetrain.planners.registry.DEFAULT_TIME_BUDGET_S`): every
synchronous run of auto that the budget leaves time for, so the default plan is auto's wherever auto
fits the budget, and the runs it skipped are named in one line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from pipetrain import api
from pipetrain.api.clusters import each_profile
from pipetrain.cli.common import (
    DEFAULT_MODEL,
    cluster_and_profiles,
    graph_of,
    load_profile,
    save_text,
    use_calibration_profile,
)
from pipetrain.cli.consoles import console, out
from pipetrain.cli.routing import PlanRoute, plan_route
from pipetrain.cli.validate import check_plan_args
from pipetrain.cluster import Cluster
from pipetrain.device_select import resolve_device
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.batch_norm import warn_batch_norm
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, LocalParams, Method
from pipetrain.plan.plan import Plan, PlanSources
from pipetrain.planners import BASE_PLANNER, DEFAULT_PLANNER, DEFAULT_TIME_BUDGET_S, PlannerSpec, get_planner
from pipetrain.planners.auto import AutoReport, skipped
from pipetrain.planners.microbatch import GA_PLANNERS, GAConfig
from pipetrain.profile.precision import parse_precision

if TYPE_CHECKING:
    from pipetrain.calibrate.machine import MachineProbe

__all__ = ["DEFAULT_TOP", "cmd_plan", "plan_and_save", "plan_model", "plan_request", "train_request"]

DEFAULT_TOP = 8
"""Candidates the planner's table lists (``plan --top``'s default)."""

_CONSTRAINT_FLAGS = {"method": "--method", "n_stages": "--stages", "n_micro": "--micro",
                     "memory_cap": "--no-memory-cap", "seed": "--seed", "ga": "--population/--generations",
                     "base": "--base", "virtual_stages": "--virtual-stages", "allow_async": "--allow-async",
                     "params": "--aux/--queue-depth", "recompute": "--recompute",
                     "time_budget_s": "--time-budget"}


def cmd_plan(args: argparse.Namespace) -> None:
    route, constraints = plan_request(args)
    graph = graph_of(args)
    check_plan_args(args, graph)
    plan_and_save(args, graph, route, constraints, args.out, top=args.top)


def plan_request(args: argparse.Namespace) -> tuple[PlanRoute, api.Constraints]:
    """The planner and constraints `plan`'s flags ask for, checked before the model loads (module
    docstring): no ``--planner`` and no ``--method`` runs ``auto`` within ``--time-budget`` (default
    :data:`~pipetrain.planners.registry.DEFAULT_TIME_BUDGET_S`), or ``balanced`` for a flag auto does
    not take (``--stages``, ``--micro``, ``--no-memory-cap``)."""
    route = plan_route(args)
    budget = args.time_budget
    if args.planner is None and args.method is None:
        if route.spec.ignored(_plan_constraints(args, route, None)):
            route = PlanRoute(get_planner(BASE_PLANNER))
        elif budget is None:
            budget = DEFAULT_TIME_BUDGET_S
    constraints = _plan_constraints(args, route, budget)
    _check_flags(route.spec, constraints)
    return route, constraints


def train_request(args: argparse.Namespace) -> tuple[PlanRoute, api.Constraints]:
    """The planner and budget ``train`` without ``--plan`` plans with: ``--planner``, else
    :data:`~pipetrain.planners.registry.DEFAULT_PLANNER` within ``--time-budget`` (default
    :data:`~pipetrain.planners.registry.DEFAULT_TIME_BUDGET_S`), as :func:`plan_request` without
    ``--method`` (train's ``--method`` re-runs the plan; it does not route the planner)."""
    budget = args.time_budget
    if args.planner is None and budget is None:
        budget = DEFAULT_TIME_BUDGET_S
    route = PlanRoute(get_planner(args.planner or DEFAULT_PLANNER))
    constraints = api.Constraints(time_budget_s=budget)
    _check_flags(route.spec, constraints)
    return route, constraints


def plan_and_save(args: argparse.Namespace, graph: LayerGraph, route: PlanRoute, constraints: api.Constraints,
                  out: Path, *, top: int = DEFAULT_TOP) -> tuple[Plan, api.Profiles]:
    """What ``plan`` does once its flags are checked, and ``train`` without ``--plan`` (the default
    route and constraints) alike: :func:`plan_model`, the plan written to ``out`` with its profile and
    cluster beside it, the planner's tables, and the lines on pipelining and noise.

    Returns:
        the plan as written (recording its measurements) and the profile it was planned with.
    """
    result, profile, cluster = plan_model(args, graph, route, constraints)
    warn_batch_norm(result.plan, graph)
    plan = _save_plan(args, result, profile, out, top)
    _when_pipelining_does_not_pay(result, profile, cluster)
    _note_within_noise(result)
    return plan, profile


def plan_model(args: argparse.Namespace, graph: LayerGraph, route: PlanRoute, constraints: api.Constraints
               ) -> tuple[api.PlanningResult, api.Profiles, Cluster]:
    """Plan ``graph`` as :func:`plan_request` asked: its profile and cluster (this machine's probe, or
    ``--profile``, ``--cluster``, ``--estimate``), :func:`pipetrain.api.plan`, the re-run method's
    plan; one line naming the runs a time budget skipped. Returns the result, the profiles and the
    cluster it planned with."""
    if route.spec.method_params() is LocalParams:  # the heads, checked against the model before any profiling
        constraints = dataclasses.replace(constraints, params=api.local_params(
            graph, args.aux, args.queue_depth or DEFAULT_QUEUE_DEPTH))
    n_ranks = args.ranks or 2
    cluster, profile = cluster_and_profiles(args, graph, args.batch, n_ranks,
                                            machine=lambda: _this_machine(args, graph, n_ranks))
    start = time.monotonic()
    result = api.plan(graph, profile, cluster, batch_size=args.batch, planner=route.spec.name,
                      optimizer=args.optimizer, constraints=constraints, progress=True,
                      precision=args.precision or "fp32", clip_grad_norm=args.clip_grad_norm is not None)
    _note_budget(result, constraints, time.monotonic() - start)
    if route.run_by is not None:
        result = _run_by(result, route.run_by, args.vertical_sync)
    return result, profile, cluster


def _note_budget(result: api.PlanningResult, constraints: api.Constraints, took_s: float) -> None:
    """One line when a time budget skipped some of auto's runs: how long it planned and which."""
    budget = constraints.time_budget_s
    left = skipped(result.report) if isinstance(result.report, AutoReport) else ()
    if budget is None or not left:
        return
    console.print(f"planned in {took_s:.0f} s, over the time budget of {budget:g} s: skipped {', '.join(left)} "
                  "(--time-budget SECONDS to allow more, or --planner NAME to run one)")


def _run_by(result: api.PlanningResult, method: Method, vertical_sync: bool) -> api.PlanningResult:
    """``result``'s fastest plan that ``method`` can run (the planner's choice, else its fastest feasible
    candidate), run by ``method``; its candidates cut to those ``method`` can run. The twin planner ranks
    its own method's plans, and ``method`` may refuse the best: 2BW needs as many micro-batches as
    stages (:attr:`~pipetrain.plan.methods.MethodSpec.microbatches_per_stage`), where a 1F1B plan of
    one micro-batch may be the fastest.

    Raises:
        UserError: ``method`` can run none of them: its refusal of the planner's choice, naming the fix.
    """
    try:
        return dataclasses.replace(result, plan=result.plan.run_by(method, vertical_sync))
    except UserError as refusal:
        runnable = [c for c in result.candidates if _runs(c.plan, method)]
        chosen = next((c.plan for c in runnable if c.feasible), None)
        if chosen is None:
            raise refusal from None
        plan = dataclasses.replace(chosen.run_by(method, vertical_sync), precision=result.plan.precision)
        return dataclasses.replace(result, plan=plan, candidates=tuple(runnable))


def _runs(plan: Plan, method: Method) -> bool:
    try:
        plan.run_by(method)
    except UserError:
        return False
    return True


def _plan_constraints(args: argparse.Namespace, route: PlanRoute, budget: float | None) -> api.Constraints:
    """`plan`'s flags as the constraints of ``route``'s planner, with the time budget ``budget``."""
    overrides = {name: getattr(args, name) for name in ("population", "generations") if getattr(args, name) is not None}
    try:
        ga = GAConfig(**overrides) if overrides else None
    except ValueError as e:
        raise UserError(f"bad GA settings: {e}; e.g. --population 64 --generations 200") from None
    return api.Constraints(method=route.method, n_stages=args.stages, n_micro=args.micro, memory_cap=args.memory_cap,
                           seed=args.seed or 0, ga=ga, virtual_stages=args.virtual_stages,
                           allow_async=args.allow_async, recompute=args.recompute, time_budget_s=budget)


def _check_flags(spec: PlannerSpec, constraints: api.Constraints) -> None:
    """A UserError naming the flags behind the constraints planner ``spec`` does not take."""
    ignored = [_CONSTRAINT_FLAGS[name] for name in spec.ignored(constraints)]
    if ignored and spec.kind == "microbatch":
        raise UserError(f"{', '.join(ignored)} only apply to the GA planners ({', '.join(GA_PLANNERS)}), not "
                        f"--planner {spec.name}; drop them or choose a GA planner")
    if ignored:
        raise UserError(f"--planner {spec.name} chooses {', '.join(ignored)} itself or does not use "
                        f"{'it' if len(ignored) == 1 else 'them'}; drop {', '.join(ignored)}")


def _when_pipelining_does_not_pay(result: api.PlanningResult, profile: api.Profiles, cluster: Cluster) -> None:
    """One line when the plan barely pipelines (one micro-batch, or devices left idle): the predicted
    time of one process on one device beside the plan's, and why (issue 32: a plan that barely
    pipelines must say so)."""
    plan, prediction = result.plan, result.plan.prediction
    micro = max(len(s.forward_sizes) for s in plan.stages)
    idle = cluster.n_devices - plan.n_ranks
    if prediction is None or (micro > 1 and idle == 0):
        return
    why = (f"the plan leaves {idle} of the {cluster.n_devices} devices idle" if idle else
           f"each stage runs the whole batch as one micro-batch, so the stages take turns "
           f"(bubble {prediction.bubble_fraction:.0%})")
    alone = api.single_process(plan, profile, cluster).iteration_s
    ranks = f"{plan.n_ranks} rank{'' if plan.n_ranks == 1 else 's'}"
    console.print(f"pipelining pays little here: {why}. One process on one device: {alone * 1e3:.2f} ms per "
                  f"iteration predicted, this plan on {ranks}: {prediction.iteration_s * 1e3:.2f} ms "
                  f"(speed-up {alone / prediction.iteration_s:.2f}×).")


def _note_within_noise(result: api.PlanningResult) -> None:
    """One line when several plans are as fast within the profile's noise (issue 32)."""
    from pipetrain.viz.plan_tables import within_noise_line

    line = within_noise_line(result)
    if line is not None:
        console.print(escape(line))


def _this_machine(args: argparse.Namespace, graph: LayerGraph, n_ranks: int) -> Cluster | None:
    """This machine probed on ``graph``'s work, or its probe cached for this machine, model and ranks
    (:func:`~pipetrain.calibrate.machine.probed_cluster`, as the demo plans), when the plan is for
    local CPU ranks: no ``--cluster``, no ``--estimate``, no GPU. None: the default cluster applies
    (then, or with ``--no-probe``, silently: the plan's cluster JSON shows it)."""
    if args.cluster is not None or args.estimate is not None or resolve_device("auto") != "cpu":
        return None
    if args.no_probe:
        return None
    from pipetrain.calibrate.machine import calibration_profile_path, probed_cluster

    def announce() -> None:
        console.print(f"[dim]probing this machine: the link, the contention between {n_ranks} ranks on "
                      f"{escape(graph.name)}'s work and the cost per action (~15 s, kept for the next plans)[/dim]")

    found = probed_cluster(graph, args.batch, n_ranks, refresh=args.reprobe, on_probe=announce)
    calibrated = calibration_profile_path(found.path).exists()
    if not calibrated and _calibrates(args):
        found, calibrated = _calibrate_here(args, graph, n_ranks, found)
    if args.profile is None:  # a calibrated probe brings its profile
        use_calibration_profile(args, found.path, parse_precision(args.precision or "fp32"))
    path = escape(str(found.path))
    again = "--reprobe to probe again, --no-probe for the unprobed defaults"
    if calibrated and found.probed_s is not None:
        console.print(f"[dim]cluster: calibrated this machine on {escape(graph.name)} in {found.probed_s:.0f} s, "
                      f"kept in {path} ({again})[/dim]")
        return found.cluster
    if calibrated:
        console.print(f"[dim]cluster: using the calibration of this machine on {escape(graph.name)} cached at {path} "
                      f"({again})[/dim]")
        return found.cluster
    if found.probed_s is None:
        console.print(f"[dim]cluster: this machine as probed before on {escape(graph.name)}, {path} ({again})[/dim]")
    else:
        console.print(f"[dim]cluster: probed this machine in {found.probed_s:.0f} s, kept in {path} ({again})[/dim]")
    console.print(f"[dim]not calibrated on {escape(graph.name)} (Core benchmark: median error 7-19% uncalibrated, "
                  f"2-3% calibrated): `{escape(_calibrate_command(args, n_ranks))}` (or `plan` without "
                  "--no-calibrate) fits it to short runs of the model once and the next plans use it[/dim]")
    return found.cluster


def _calibrates(args: argparse.Namespace) -> bool:
    """Whether `plan` calibrates this machine's probe itself: not with --no-calibrate or
    ``PIPETRAIN_CALIBRATE=0``, nor at a precision other than fp32 (the calibration runs train at fp32)."""
    from pipetrain.calibrate.machine import calibration_wanted

    return not args.no_calibrate and calibration_wanted() and (args.precision or "fp32") == "fp32"


def _calibrate_here(args: argparse.Namespace, graph: LayerGraph, n_ranks: int,
                    found: MachineProbe) -> tuple[MachineProbe, bool]:
    """Calibrate ``found`` on short runs of ``graph`` training with ``args.optimizer``, against the
    profile planning will use (``--profile``, else one measured now and kept with the calibration);
    the probe as it was, with one line, when the model cannot run them. Returns the probe and whether
    it is calibrated."""
    from pipetrain.calibrate.machine import calibrate_machine

    profile = load_profile(args, graph, args.batch, "fp32")
    console.print(f"[dim]calibrating this machine on {escape(graph.name)}: three short runs of it on {n_ranks} ranks, "
                  f"training with {args.optimizer} (once: kept with the probe; --no-calibrate to skip)[/dim]")
    try:
        calibrated, calibration = calibrate_machine(graph, args.batch, found, profile, args.optimizer)
    except UserError as e:
        console.print(f"[dim]not calibrated: {escape(str(e))}[/dim]")
        return found, False
    console.print(f"[dim]calibrated: {escape(calibration.describe())}[/dim]")
    return calibrated, True


def _calibrate_command(args: argparse.Namespace, n_ranks: int) -> str:
    """The `pipetrain probe --calibrate` whose result `plan` with these flags reuses."""
    data = "" if args.data is None else f" --data {args.data}"
    optimizer = "" if args.optimizer == "sgd" else f" --optimizer {args.optimizer}"  # calibration runs it
    return (f"pipetrain probe --model {args.model or DEFAULT_MODEL}{data} --batch {args.batch} --ranks {n_ranks} "
            f"--calibrate{optimizer}")


def _save_plan(args: argparse.Namespace, result: api.PlanningResult, profile: api.Profiles, path: Path,
               top: int) -> Plan:
    """Write the plan to ``path``, with the profile and the cluster it was made with beside it (which it
    records, :func:`_save_measurements`), print the planner's tables (``top`` candidates), and return it."""
    plan = dataclasses.replace(result.plan, measurements=_save_measurements(args, result, profile, path))
    save_text(path, plan.to_json(), "plan")
    from pipetrain.viz.plan_tables import result_tables

    for table in result_tables(result, top=top):
        out.print(table)
    return plan


def _save_measurements(args: argparse.Namespace, result: api.PlanningResult, profile: api.Profiles,
                       path: Path) -> PlanSources:
    """Save what the plan was made with beside its file ``path`` (``PLAN.profile.json``, ``PLAN.cluster.json``)
    for ``simulate`` and ``train`` to reuse. Copies, even of a given ``--profile`` or probe JSON: a
    later ``pipetrain profile`` or ``probe`` over those files leaves the plan's numbers as they were.
    Not copied: a cluster spec YAML (its groups' ``profile:`` files are relative to it), recorded by
    its path relative to the plan's folder; and profiles that differ by device kind (no one file holds
    them; the spec or the cluster's device models give them again)."""
    folder = path.parent
    distinct = {id(p): p for p in each_profile(profile)}
    profile_name = None
    if len(distinct) == 1:
        saved = path.with_suffix(".profile.json")
        save_text(saved, next(iter(distinct.values())).to_json(), "the profile it was planned with")
        profile_name = saved.name
    if args.cluster is not None and args.cluster.suffix in (".yaml", ".yml"):
        return PlanSources(profile_name, os.path.relpath(args.cluster.resolve(), folder.resolve()))
    n, planned = result.plan.n_ranks, result.cluster
    if n < planned.n_devices:  # the plan's ranks are the first n devices of the planner's cluster
        planned = dataclasses.replace(planned, devices=planned.devices[:n], name=f"{planned.name}[:{n}]")
    saved = path.with_suffix(".cluster.json")
    save_text(saved, planned.to_json(), f"the {planned.n_devices} devices it was planned on")
    return PlanSources(profile_name, saved.name)
