"""The sub-commands: each reads its options, calls :mod:`pipetrain.api` (or the runtime) and prints."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from pipetrain import api
from pipetrain.cli.common import (
    cluster_and_profiles,
    console,
    graph_of,
    load_plan,
    load_profile,
    load_schedule,
    out,
    save_text,
)
from pipetrain.cli.options import ASYNC_METHODS, SYNC_RERUN_METHODS
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.data import default_source
from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import check_aux, default_aux
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, METHODS, LocalParams, Method, MethodParams
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan
from pipetrain.planners import PlannerSpec
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import MULTI_STAGE_METHODS, build_interleaved_plan, v_placed
from pipetrain.planners.microbatch import GA_PLANNERS, GAConfig
from pipetrain.simulate.timeline import Timeline

if TYPE_CHECKING:
    from pipetrain.graph.layer_graph import LayerGraph
    from pipetrain.runtime.job.config import TrainResult

__all__ = ["cmd_compare", "cmd_demo", "cmd_export", "cmd_plan", "cmd_probe", "cmd_profile", "cmd_simulate", "cmd_train"]


def cmd_profile(args: argparse.Namespace) -> None:
    graph = graph_of(args)
    profile = api.profile_model(graph, args.batch, estimate=args.estimate, progress=True, repeats=args.repeats,
                                loss=args.loss)
    save_text(args.out, profile.to_json(), "profile")
    from pipetrain.viz.plan_tables import profile_table

    out.print(profile_table(profile))


def cmd_probe(args: argparse.Namespace) -> None:
    from pipetrain.calibrate.overhead import probe_local_cluster

    if args.calibrate and args.model is None:
        raise UserError("--calibrate fits the terms to runs of your model: add --model (and --batch)")
    model = None if args.model is None else (graph_of(args), max(1, args.batch // 4))
    cluster = probe_local_cluster(args.ranks, probes=args.probes, action_overhead_s=args.overhead, model=model)
    calibration = None
    if model is not None and args.calibrate:
        from pipetrain.calibrate.fit import calibrate_cluster

        profile = api.profile_model(model[0], args.batch, progress=True)
        out.print(f"calibrating on {model[0].name}: three short runs of it on {args.ranks} ranks ...")
        calibration = calibrate_cluster(model[0], profile, cluster, args.batch)
        cluster = calibration.apply(cluster)
    save_text(args.out, cluster.to_json(), "cluster")
    link = cluster.intra_node
    how = "measured" if args.overhead is None else "given"
    out.print(
        f"link: latency {link.latency_s * 1e6:.0f} µs, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
        f"two ranks computing at once each run at {cluster.concurrency_speed(2):.2f}× their speed alone "
        f"(median of {args.probes} probes{'' if model is None else f', on {model[0].name} work'}); "
        f"{cluster.action_overhead_s * 1e6:.0f} µs per action ({how if calibration is None else 'calibrated'})"
    )
    if calibration is not None:
        out.print(f"calibrated on {args.model}: {calibration.describe()}")
    if cluster.collective is not None:
        two = cluster.collective
        out.print(f"all-reduce over 2 ranks: {2 * two.latency_s * 1e6:.0f} µs + "
                  f"{two.bandwidth_bytes_per_s / 1e9:.2f} GB/s (ring step: latency {two.latency_s * 1e6:.0f} µs)")


_CONSTRAINT_FLAGS = {"method": "--method", "n_stages": "--stages", "n_micro": "--micro",
                     "memory_cap": "--no-memory-cap", "seed": "--seed", "ga": "--population/--generations",
                     "base": "--base", "virtual_stages": "--virtual-stages", "allow_async": "--allow-async"}


def _planner_name(args: argparse.Namespace) -> str:
    """The registry name `plan`'s --method and --planner select; a UserError for combinations that
    do not go together (checked before any profiling)."""
    uedp = args.method == Method.UEDP.value
    own = {Method.GRAPH.value: "graphpipe", Method.INTERLEAVED.value: "interleaved",
           Method.INTERLEAVED_ZB.value: "interleaved", Method.ZBV.value: "interleaved"}  # a method's own planner
    if args.method in own:
        if args.planner not in (None, own[args.method]):
            raise UserError(f"--method {args.method} is planned by --planner {own[args.method]}, not {args.planner}; "
                            f"drop --planner or --method {args.method}")
        return own[args.method]
    if args.virtual_stages is not None and not uedp:
        raise UserError("--virtual-stages is for --method interleaved, interleaved-zb, zbv or uedp; add one or drop "
                        "--virtual-stages")
    flags = ("planner", "seed", "population", "generations")
    given = [f"--{name}" for name in flags if getattr(args, name) is not None]
    if not uedp and given and (args.planner is None or args.planner in api.MICROBATCH_PLANNERS):
        raise UserError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for UMPIPE's unequal "
                        f"micro-batches: add --method uedp (--method is {args.method})")
    if not uedp:
        return str(args.planner or "balanced")
    if args.planner in api.STAGE_PLANNERS:
        raise UserError("--method uedp plans micro-batches with a micro-batch planner (tidgap, 1f1b-ga...); "
                        "--planner auto already tries them; drop --method uedp or choose a micro-batch planner")
    if args.virtual_stages is not None:
        return _virtual_uedp_planner(args)
    return str(args.planner or "tidgap")


def _virtual_uedp_planner(args: argparse.Namespace) -> str:
    """``--method uedp --virtual-stages V``: UMPIPE's unequal micro-batches per virtual stage of an
    interleaved plan with ``V`` chunks per rank, the ``interleaved-ga`` planner; a UserError for
    ``V < 2`` or another micro-batch planner."""
    if args.virtual_stages < 2:
        raise UserError(f"--virtual-stages {args.virtual_stages} is one model chunk per rank: drop it for plain "
                        "--method uedp, or give 2 or more for unequal micro-batches per virtual stage")
    if args.planner not in (None, "interleaved-ga"):
        raise UserError(f"--method uedp --virtual-stages plans unequal micro-batches per virtual stage with the "
                        f"interleaved-ga planner, not --planner {args.planner}; drop --planner or --virtual-stages")
    return "interleaved-ga"


def _plan_constraints(args: argparse.Namespace, spec: PlannerSpec) -> api.Constraints:
    """`plan`'s flags as the planner's constraints; a UserError naming the flags it does not take."""
    overrides = {name: getattr(args, name) for name in ("population", "generations") if getattr(args, name) is not None}
    try:
        ga = GAConfig(**overrides) if overrides else None
    except ValueError as e:
        raise UserError(f"bad GA settings: {e}; e.g. --population 64 --generations 200") from None
    method = _planned_method(args, spec)
    fixed = method if method in (*(m.value for m in (*api.PLANNABLE_METHODS, *MULTI_STAGE_METHODS)),
                                 *_ASYNC_PLANNERS.values()) else None
    constraints = api.Constraints(method=None if fixed is None else Method(fixed), n_stages=args.stages,
                                  n_micro=args.micro, memory_cap=args.memory_cap, seed=args.seed or 0, ga=ga,
                                  virtual_stages=args.virtual_stages, allow_async=args.allow_async)
    ignored = [_CONSTRAINT_FLAGS[name] for name in spec.ignored(constraints)]
    if ignored and spec.kind == "microbatch":
        raise UserError(f"{', '.join(ignored)} only apply to the GA planners ({', '.join(GA_PLANNERS)}), not "
                        f"--planner {spec.name}; drop them or choose a GA planner")
    if ignored:
        raise UserError(f"--planner {spec.name} chooses {', '.join(ignored)} itself or does not use "
                        f"{'it' if len(ignored) == 1 else 'them'}; drop {', '.join(ignored)}")
    return constraints


def _check_local_flags(args: argparse.Namespace, local: bool) -> None:
    """--aux and --queue-depth go with local learning only."""
    if not local and (args.aux is not None or args.queue_depth is not None):
        raise UserError(f"--aux and --queue-depth are for local learning (--method is {args.method}): "
                        "add --method local or drop them")


MULTI_STAGE_NAMES = tuple(m.value for m in MULTI_STAGE_METHODS)

_ASYNC_PLANNERS = {"pipedream": Method.PIPEDREAM.value, "2bw": Method.TWO_BW.value}
"""The planners that plan an asynchronous method themselves, and which."""


def _planned_method(args: argparse.Namespace, spec: PlannerSpec) -> str:
    """The method `plan` asks the planner for: ``pipedream`` from the pipedream planner's own objective,
    ``2bw`` from the 2bw planner; other planners plan 1f1b for an asynchronous --method (then run by it)."""
    own = _ASYNC_PLANNERS.get(spec.name)
    if own is not None and args.method not in ("auto", own):
        what = "gpipe or 1f1b, " if spec.name == "pipedream" else ""
        raise UserError(f"--planner {spec.name} chooses --method itself ({what}or {own} when asked); drop --method "
                        f"or pass --method {own}")
    if own is None and args.method in ASYNC_METHODS:
        return Method.ONE_F_ONE_B.value  # then run asynchronously
    return str(args.method)


def cmd_plan(args: argparse.Namespace) -> None:
    if args.method == Method.LOCAL.value:
        _plan_local(args)
        return
    _check_local_flags(args, False)
    spec = api.get_planner(_planner_name(args))
    constraints = _plan_constraints(args, spec)
    graph = graph_of(args)
    api.check_stage_count(graph, args.stages or args.ranks or 2)
    cluster, profile = cluster_and_profiles(args, graph, args.batch, args.ranks or 2)
    result = api.plan(graph, profile, cluster, batch_size=args.batch, planner=spec.name, optimizer=args.optimizer,
                      constraints=constraints, progress=True)
    _save_plan(args, dataclasses.replace(result, plan=_run_by(result.plan, args, graph)), cluster)


def _plan_local(args: argparse.Namespace) -> None:
    """`plan --method local`: the local planner balances stages with their auxiliary heads' time."""
    given = [f"--{name.replace('_', '-')}" for name in ("planner", "seed", "population", "generations")
             if getattr(args, name) is not None] + (["--vertical-sync"] if args.vertical_sync else [])
    if given:
        raise UserError(f"--method local balances its stages with their heads itself and does not take "
                        f"{', '.join(given)}; drop {'it' if len(given) == 1 else 'them'}")
    graph = graph_of(args)
    api.check_stage_count(graph, args.stages or args.ranks or 2)
    check_aux(graph, args.aux or default_aux(graph))  # before any profiling
    cluster, profile = cluster_and_profiles(args, graph, args.batch, args.ranks or 2)
    result = api.plan_local(graph, profile, cluster, batch_size=args.batch, aux=args.aux,
                            queue_depth=args.queue_depth or DEFAULT_QUEUE_DEPTH, n_stages=args.stages,
                            n_micro=args.micro)
    params = result.plan.params
    assert isinstance(params, LocalParams)
    out.print(f"local learning ({params.aux} heads, queues of {params.queue_depth}), stages balanced with their heads: "
              f"predicted {result.candidates[0].iteration_s * 1e3:.2f} ms per iteration")
    _save_plan(args, result, cluster)


def _save_plan(args: argparse.Namespace, result: api.PlanningResult, cluster: Cluster) -> None:
    """Write the plan (and the sub-cluster it uses) and print the planner's tables."""
    save_text(args.out, result.plan.to_json(), "plan")
    n, planned = result.plan.n_ranks, result.cluster
    if n < planned.n_devices:  # the plan's ranks are the first n devices of the planner's cluster
        planned = dataclasses.replace(planned, devices=planned.devices[:n], name=f"{planned.name}[:{n}]")
    if planned.n_devices != cluster.n_devices:
        used = args.out.with_suffix(".cluster.json")
        save_text(used, planned.to_json(), f"the {planned.n_devices} devices the plan uses")
        console.print(f"[dim]the plan leaves devices idle; pass --cluster {used} to simulate it[/dim]")
    from pipetrain.viz.plan_tables import result_tables

    for table in result_tables(result, top=args.top):
        out.print(table)


def _run_by(plan: Plan, args: argparse.Namespace, graph: LayerGraph) -> Plan:
    """``plan`` run by ``--method pipedream|2bw`` (with ``--vertical-sync``), ``zb1|1f1b``, or ``--method local`` (with
    ``--aux``, ``--queue-depth``) when given; else as it is."""
    local = args.method == Method.LOCAL.value
    _check_local_flags(args, local or (args.method is None and plan.method is Method.LOCAL))
    if args.vertical_sync and args.method != Method.PIPEDREAM.value:
        raise UserError("--vertical-sync applies to --method pipedream; add --method pipedream or drop it")
    if args.method in ASYNC_METHODS or args.method in SYNC_RERUN_METHODS:
        if plan.method.value == args.method and not args.vertical_sync:
            return plan  # planned for it (e.g. --planner pipedream|2bw): keep the prediction
        return plan.run_by(Method(args.method), args.vertical_sync)
    if local or (plan.method is Method.LOCAL and (args.aux is not None or args.queue_depth is not None)):
        own: MethodParams = plan.params
        depth = args.queue_depth or (own.queue_depth if isinstance(own, LocalParams) else DEFAULT_QUEUE_DEPTH)
        aux = args.aux or (own.aux if isinstance(own, LocalParams) else None)
        return api.local_plan(plan, graph, aux=aux, queue_depth=depth)
    return plan


def _rechunked(plan: Plan, args: argparse.Namespace, graph: LayerGraph) -> Plan:
    """``simulate|train --method interleaved|interleaved-zb --virtual-stages V``: the plan's layers cut
    into ``V·R`` stages balanced on the profile, stage ``s`` on rank ``s mod R``, with the plan's
    micro-batch count (equal sizes); the plan itself without ``--virtual-stages``. ``--method zbv``:
    a plan with 2 chunks per rank placed in a V, else its layers cut into ``2R`` such stages."""
    if args.method in MULTI_STAGE_NAMES and METHODS[Method(args.method)].placement is Placement.V \
            and plan.placement is not Placement.V:
        if plan.virtual_stages == 2 and args.virtual_stages in (None, 2):
            return v_placed(dataclasses.replace(plan, method=Method(args.method)))
        args = argparse.Namespace(**{**vars(args), "virtual_stages": args.virtual_stages or 2})
    if args.virtual_stages is None:
        return plan
    if args.method not in MULTI_STAGE_NAMES:
        raise UserError("--virtual-stages is for --method interleaved, interleaved-zb or zbv; add one or drop "
                        "--virtual-stages")
    if plan.edges or plan.replicated:
        raise UserError("--virtual-stages re-cuts a chain plan with one rank per stage; drop it for this plan")
    cluster, profile = cluster_and_profiles(args, graph, plan.batch_size, plan.n_ranks)
    return build_interleaved_plan(ModelRef.of(graph), CostModel(profile, cluster), n_ranks=plan.n_ranks,
                                  chunks=args.virtual_stages, batch_size=plan.batch_size,
                                  n_micro=len(plan.stages[0].forward_sizes), method=Method(args.method))


def _predict(args: argparse.Namespace, plan: Plan, graph: LayerGraph) -> tuple[CostModel, Timeline]:
    n_ranks = args.ranks or plan.n_ranks
    if n_ranks < plan.n_ranks:
        raise UserError(f"the plan uses {plan.n_ranks} ranks but --ranks is {n_ranks}; pass --ranks {plan.n_ranks}")
    cluster, profile = cluster_and_profiles(args, graph, plan.batch_size, n_ranks)
    schedule, predicted = api.predict(plan, profile, cluster, schedule=load_schedule(args), graph=graph)
    if getattr(args, "out_dir", None) is not None:
        save_text(args.out_dir / "schedule.csv", schedule.to_csv(), "schedule")
    return api.cost_of(plan, profile, cluster, graph), predicted


def cmd_simulate(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    graph = api.graph_for_plan(plan, data=args.data, leaf_modules=args.leaf or ())
    plan = _run_by(_rechunked(plan, args, graph), args, graph)
    cost, predicted = _predict(args, plan, graph)
    _write_timeline(args.out_dir, "predicted", predicted, plan)
    from pipetrain.simulate.memory import device_memory, stage_memory
    from pipetrain.viz.tables import memory_table, timeline_table

    out.print(timeline_table(predicted, plan.rank_stages))
    if plan.asynchronous or plan.method is Method.LOCAL:
        from pipetrain.simulate.steady import steady_state

        steady = steady_state(plan, cost)
        how, fill = (", run as a stream of batches through bounded queues,", "once per batch here, as the runtime "
                     "runs one batch per schedule") if plan.method is Method.LOCAL else \
            (" runs batches without a flush (the timeline shows several):", "once per run")
        out.print(f"{plan.method.value}{how} steady state {steady.samples_per_s:.1f} samples/s, "
                  f"{steady.batch_s * 1e3:.2f} ms per batch; filling and draining the pipeline adds "
                  f"{steady.warmup_s * 1e3:.2f} ms {fill}")
    memories = stage_memory(plan, cost, optimizer=args.optimizer)
    out.print(memory_table(memories, device_memory(plan, cost), optimizer=args.optimizer))


def _write_timeline(folder: Path, name: str, timeline: Timeline, plan: Plan) -> None:
    from pipetrain.viz.files import save_timeline

    save_timeline(folder, name, timeline, plan.rank_stages)
    console.print(f"[dim]wrote {name} timeline, Chrome trace (open in https://ui.perfetto.dev) and Gantt: "
                  f"{folder}/{name}.json, {folder}/{name}_trace.json, {folder}/{name}.png[/dim]")


def cmd_train(args: argparse.Namespace) -> None:
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if under_torchrun and args.plan is None:
        raise UserError("under torchrun every rank must use the same plan: make one with `pipetrain plan`, "
                        "then pass --plan plan.json")
    if args.schedule is not None and args.plan is None:
        raise UserError("--schedule runs a schedule of a given plan: pass --plan plan.json as well")
    if args.plan is not None:
        plan = load_plan(args.plan)
        if args.model is not None and args.model != plan.model:
            raise UserError(f"--model {args.model} but {args.plan} was made for {plan.model}; drop --model to train "
                            f"the plan's model, or plan anew with --model {args.model}")
        graph = api.graph_for_plan(plan, data=args.data, leaf_modules=args.leaf or ())
    else:
        graph = graph_of(args)
        plan, _ = api.plan_pipeline(graph, load_profile(args, graph, args.batch),
                                    api.local_cluster(args.ranks or 2, args.cluster), batch_size=args.batch)
    plan = _run_by(_rechunked(plan, args, graph), args, graph)
    schedule = load_schedule(args)
    from pipetrain.runtime import TrainConfig, run_worker_from_env, train

    config = TrainConfig(steps=20 if args.steps is None else args.steps, epochs=args.epochs, optimizer=args.optimizer,
                         lr=args.lr, data=args.data or default_source(graph), loss=args.loss,
                         eval_every=args.eval_every, seed=args.seed, timeout_s=args.timeout,
                         threads_per_rank=args.threads, out=args.out_dir, momentum=args.momentum,
                         weight_decay=args.weight_decay, lr_schedule=args.lr_schedule,
                         lr_warmup_steps=args.warmup_steps, clip_grad_norm=args.clip_grad_norm,
                         checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, keep=args.keep,
                         resume=args.resume)
    if under_torchrun:
        result = run_worker_from_env(graph, plan, config, schedule=schedule)
        if result is None:  # not rank 0
            return
    else:
        result = train(graph, plan, config, schedule=schedule)
    _write_timeline(args.out_dir, "measured", result.timeline, plan)
    _summarise_training(plan, result)
    _plot_losses(args.out_dir, result, f"{plan.model} on {config.data}")


def _plot_losses(folder: Path, result: TrainResult, title: str) -> None:
    """``loss.png`` from ``metrics.csv`` (a resumed run's earlier steps included), else from the result
    (under torchrun the last stage may have written the CSV on another node)."""
    from pipetrain.runtime.job.metrics import METRICS_FILE, read_metrics
    from pipetrain.viz.curves import save_loss_plot

    csv_path = folder / METRICS_FILE
    rows = read_metrics(csv_path) if csv_path.exists() else result.metrics
    save_loss_plot(rows, folder / "loss.png", title=title)
    console.print(f"[dim]wrote {csv_path} and {folder}/loss.png (train and eval curves)[/dim]")


def _summarise_training(plan: Plan, result: TrainResult) -> None:
    """Two lines: how the loss went and how fast, then the last evaluation."""
    steps, waits = len(result.losses), result.data_wait_s
    wait = f"data wait {statistics.median(waits[1:]) * 1e3:.2f} ms/step" if len(waits) > 1 else "data wait"
    out.print(f"trained {plan.model} for {steps} steps: loss {result.losses[0]:.4f} → {result.losses[-1]:.4f}, "
              f"{result.samples_per_s:.1f} samples/s (median step, slowest rank: "
              f"{result.timeline.iteration_s * 1e3:.1f} ms), "
              f"{wait} (first batch {waits[0]:.2f} s, loading the data)")
    final = result.final_eval
    if final is not None and final.eval_loss is not None:
        accuracy = f", accuracy {final.eval_accuracy:.1%}" if final.eval_accuracy is not None else ""
        out.print(f"eval after step {final.step}: loss {final.eval_loss:.4f}{accuracy}")


def cmd_compare(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    predicted, measured = Timeline.load(args.predicted), Timeline.load(args.measured)
    for flag, timeline, kind in (("--predicted", predicted, "predicted"), ("--measured", measured, "measured")):
        if timeline.n_ranks != plan.n_ranks:
            raise UserError(f"{flag} has {timeline.n_ranks} ranks but the plan {plan.n_ranks}; compare the timelines "
                            "of this plan (`pipetrain simulate` and `train` with --plan)")
        if timeline.kind != kind:
            raise UserError(f"{flag} is a {timeline.kind} timeline; pass the {kind} one (`pipetrain "
                            f"{'simulate' if kind == 'predicted' else 'train'} --out` writes {kind}.json)")
    picture = args.out if args.out.suffix else args.out.with_suffix(".png")
    if picture.suffix.lower() != ".png":
        raise UserError(f"--out {args.out}: compare writes a PNG picture; give a name ending in .png "
                        f"(e.g. --out {args.out.with_suffix('.png')})")
    _show_comparison(plan, predicted, measured, picture)


def _show_comparison(plan: Plan, predicted: Timeline, measured: Timeline, picture: Path) -> None:
    from pipetrain.viz.files import save_comparison
    from pipetrain.viz.tables import compare_table

    out.print(compare_table(predicted, measured, plan.rank_stages))
    save_comparison(picture, predicted, measured, plan.rank_stages)
    console.print(f"[dim]wrote predicted-vs-measured Gantt: {picture}[/dim]")


def cmd_export(args: argparse.Namespace) -> None:
    from pipetrain.runtime.job.checkpoint import export_checkpoint

    checkpoint, tensors, size = export_checkpoint(args.checkpoint, args.out, with_heads=args.with_heads)
    model = escape(str(checkpoint.manifest.get("model")))
    out.print(f"exported {model} after step {checkpoint.step} ({escape(str(checkpoint.folder))}): {tensors} tensors, "
              f"{size:,} bytes of tensors → {escape(str(args.out))}")


def cmd_demo(args: argparse.Namespace) -> None:
    from pipetrain.demo import DemoSettings, run_demo

    run_demo(DemoSettings(args.model, args.batch, args.ranks, args.steps, args.out_dir), out, console)


