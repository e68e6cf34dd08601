"""``pipetrain simulate`` and ``pipetrain compare``: a plan's predicted timeline, and predicted beside measured."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from pipetrain import api
from pipetrain.cli.common import cluster_and_profiles, load_plan, load_schedule, save_text, use_plan_measurements
from pipetrain.cli.consoles import console, out
from pipetrain.cli.rerun import rechunked, rerun
from pipetrain.cli.validate import check_simulate_args
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.plan import Plan
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Timeline

__all__ = ["cmd_compare", "cmd_simulate", "write_timeline"]


def _predict(args: argparse.Namespace, plan: Plan, graph: LayerGraph) -> tuple[CostModel, Timeline]:
    n_ranks = args.ranks or plan.n_ranks
    if n_ranks < plan.n_ranks:
        raise UserError(f"the plan uses {plan.n_ranks} ranks but --ranks is {n_ranks}; pass --ranks {plan.n_ranks}")
    cluster, profile = cluster_and_profiles(args, graph, plan.batch_size, n_ranks, plan.precision)
    given = load_schedule(args)
    schedule, predicted = api.predict(plan, profile, cluster, graph=graph,
                                      schedule=given if given is not None else _drained(args, plan))
    if getattr(args, "out_dir", None) is not None:
        save_text(args.out_dir / "schedule.csv", schedule.to_csv(), "schedule")
    return api.cost_of(plan, profile, cluster, graph), predicted


def _drained(args: argparse.Namespace, plan: Plan) -> Schedule | None:
    """An asynchronous plan's predicted run, drained every ``--checkpoint-every`` steps; None: the plan's own."""
    every = getattr(args, "checkpoint_every", 0)
    if not plan.asynchronous or every <= 0:
        return None
    from pipetrain.schedule.generators import DEFAULT_ASYNC_BATCHES
    from pipetrain.schedule.segments import drain_points, segmented_schedule

    return segmented_schedule(plan, DEFAULT_ASYNC_BATCHES, drain_points(DEFAULT_ASYNC_BATCHES, every))


def cmd_simulate(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    check_simulate_args(args, plan.method)
    notes = use_plan_measurements(args, plan, args.plan)
    graph = api.graph_for_plan(plan, data=args.data, leaf_modules=args.leaf or ())
    plan = _with_optimizer(rerun(rechunked(plan, args, graph), args, graph), args.optimizer)
    for note in notes:
        console.print(note)
    cost, predicted = _predict(args, plan, graph)
    write_timeline(args.out_dir, "predicted", predicted, plan)
    from pipetrain.simulate.memory import device_memory, stage_memory
    from pipetrain.viz.tables import memory_table, timeline_table

    recomputes = [plan.recomputes(k) for k in range(plan.n_stages)]
    out.print(timeline_table(predicted, plan.rank_stages, recompute=recomputes))
    streamed = plan.params.queue_bound is not None  # bounded queues: local learning
    if plan.asynchronous or streamed:
        from pipetrain.simulate.steady import steady_state

        steady = steady_state(plan, cost)
        how, fill = (", run as a stream of batches through bounded queues,", "once per batch here, as the runtime "
                     "runs one batch per schedule") if streamed else \
            (" runs batches without a flush (the timeline shows several):", "once per run")
        out.print(f"{plan.method.value}{how} steady state {steady.samples_per_s:.1f} samples/s, "
                  f"{steady.batch_s * 1e3:.2f} ms per batch; filling and draining the pipeline adds "
                  f"{steady.warmup_s * 1e3:.2f} ms {fill}")
        if plan.asynchronous and args.checkpoint_every > 0:
            drained = steady.drained_samples_per_s(args.checkpoint_every)
            out.print(f"a checkpoint every {args.checkpoint_every} steps drains the pipeline each time: "
                      f"{drained:.1f} samples/s ({1 - drained / steady.samples_per_s:.1%} below the steady state)")
    memories = stage_memory(plan, cost, optimizer=plan.optimizer)
    out.print(memory_table(memories, device_memory(plan, cost), optimizer=plan.optimizer, recompute=recomputes))


def _with_optimizer(plan: Plan, optimizer: OptimizerName | None) -> Plan:
    """``plan`` priced with ``--optimizer`` (None: the plan's own); one line when it is not the plan's."""
    if optimizer is None or optimizer == plan.optimizer:
        return plan
    out.print(f"pricing the step and memory of {optimizer} (--optimizer), not the plan's {plan.optimizer}")
    return dataclasses.replace(plan, optimizer=optimizer)


def write_timeline(folder: Path, name: str, timeline: Timeline, plan: Plan) -> None:
    from pipetrain.viz.files import save_timeline

    save_timeline(folder, name, timeline, plan.rank_stages)
    console.print(f"[dim]wrote {name} timeline, Chrome trace (open in https://ui.perfetto.dev) and Gantt: "
                  f"{folder}/{name}.json, {folder}/{name}_trace.json, {folder}/{name}.png[/dim]")


def cmd_compare(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    predicted, measured = Timeline.load(args.predicted), Timeline.load(args.measured)
    for flag, timeline, kind in (("--predicted", predicted, "predicted"), ("--measured", measured, "measured")):
        if timeline.n_ranks != plan.n_ranks:
            raise UserError(f"{flag} has {timeline.n_ranks} ranks but the plan {plan.n_ranks}; compare the timelines "
                            "of this plan (`pipetrain simulate` and `train` with --plan)")
        if timeline.kind != kind:
            raise UserError(f"{flag} is a {timeline.kind} timeline; pass the {kind} one (`pipetrain "
                            f"{'simulate' if kind == 'predicted' else 'train'} --out-dir` writes {kind}.json)")
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
