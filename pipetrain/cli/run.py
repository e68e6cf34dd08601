"""``pipetrain train``, ``pipetrain export`` and ``pipetrain demo``: run a plan, keep its model, show the loop."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from pipetrain import api
from pipetrain.cli.common import graph_of, load_plan, load_schedule, save_text, use_plan_measurements
from pipetrain.cli.consoles import console, out
from pipetrain.cli.predict import write_timeline
from pipetrain.cli.rerun import rechunked, rerun
from pipetrain.cli.run_folder import PLAN_FILE, claim_folder
from pipetrain.cli.validate import check_train_args
from pipetrain.data import default_source
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile

if TYPE_CHECKING:
    from pipetrain.runtime.job.config import TrainConfig, TrainResult

__all__ = ["cmd_demo", "cmd_export", "cmd_train"]


def cmd_train(args: argparse.Namespace) -> None:
    from pipetrain.cli.planning import plan_and_save, train_request

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    _check_plan_flags(args, under_torchrun)
    request = train_request(args) if args.plan is None else None  # a bad planner flag fails before profiling
    planned_with: Profile | None = None  # the profile this command planned with (no --plan)
    notes: list[str] = []  # about the plan's measurements, once the options are checked
    given = None if args.plan is None else load_plan(args.plan)
    if given is not None:
        if args.model is not None and args.model != given.model:
            raise UserError(f"--model {args.model} but {args.plan} was made for {given.model}; drop --model to train "
                            f"the plan's model, or plan anew with --model {args.model}")
        if args.precision in (None, given.precision):  # at another precision its measurements do not apply
            notes = use_plan_measurements(args, given, args.plan)
        graph = api.graph_for_plan(given, data=args.data, leaf_modules=args.leaf or ())
    else:
        graph = graph_of(args)
    config = _train_config(args, graph)
    check_train_args(args, graph, config, None if given is None else given.method)
    _claim(args, graph, under_torchrun)
    if given is not None:
        plan = given
    else:  # as `pipetrain plan` with its defaults would, into the run's folder (torchrun needs --plan: never here)
        assert request is not None
        plan, profiles = plan_and_save(args, graph, *request, args.out_dir / PLAN_FILE)
        planned_with = profiles if isinstance(profiles, Profile) else None
    trained = _at_precision(rerun(rechunked(plan, args, graph), args, graph), args)
    if given is None and trained is not plan:  # --method or --precision: the plan it trains, on the same measurements
        trained = dataclasses.replace(trained, measurements=plan.measurements)
        save_text(args.out_dir / PLAN_FILE, trained.to_json(), "the plan it trains (`pipetrain simulate --plan` it)")
    plan = trained
    _note_optimizer(plan, args)
    for note in notes:
        console.print(note)
    schedule = load_schedule(args)
    from pipetrain.runtime import run_worker_from_env, train

    rates = config.stage_rates(plan)
    if (rates.changed or plan.asynchronous) and os.environ.get("RANK", "0") == "0":  # once under torchrun
        out.print(escape(rates.describe(config.lr)))
    if under_torchrun:
        result = run_worker_from_env(graph, plan, config, schedule=schedule)
        if result is None:  # not rank 0
            return
    else:
        result = train(graph, plan, config, schedule=schedule)
    write_timeline(args.out_dir, "measured", result.timeline, plan)
    _summarise_training(plan, result)
    _summarise_memory(args, graph, plan, config, result, planned_with)
    _plot_losses(args.out_dir, result, f"{plan.model} on {config.data}")


def _check_plan_flags(args: argparse.Namespace, under_torchrun: bool) -> None:
    """The flags that need ``--plan`` (torchrun, ``--schedule``) or go only without one (the probe's)."""
    if under_torchrun and args.plan is None:
        raise UserError("under torchrun every rank must use the same plan: make one with `pipetrain plan`, "
                        "then pass --plan plan.json")
    if args.plan is not None and (args.reprobe or args.no_probe):
        raise UserError(f"{'--reprobe' if args.reprobe else '--no-probe'} is for train without --plan (it plans on "
                        "this machine's probe); a --plan is priced on its own cluster: drop it")
    planning = [flag for flag, value in (("--planner", args.planner), ("--time-budget", args.time_budget))
                if value is not None]
    if args.plan is not None and planning:
        flags, verb = " and ".join(planning), "says" if len(planning) == 1 else "say"
        raise UserError(f"{flags} {verb} how train plans without --plan; {args.plan} is planned already: drop "
                        f"{flags}, or drop --plan to plan anew")
    if args.schedule is not None and args.plan is None:
        raise UserError("--schedule runs a schedule of a given plan: pass --plan plan.json as well")


def _train_config(args: argparse.Namespace, graph: LayerGraph) -> TrainConfig:
    """`train`'s settings (checked as they are made: ranges, the optimizer's, the schedule's)."""
    from pipetrain.runtime import TrainConfig

    return TrainConfig(steps=20 if args.steps is None else args.steps, epochs=args.epochs, optimizer=args.optimizer,
                       lr=args.lr, data=args.data or default_source(graph), loss=args.loss,
                       eval_every=args.eval_every, seed=args.seed, timeout_s=args.timeout,
                       threads_per_rank=args.threads, out=args.out_dir, momentum=args.momentum,
                       weight_decay=args.weight_decay, lr_schedule=args.lr_schedule,
                       lr_warmup_steps=args.warmup_steps, lr_rule=args.lr_rule, clip_grad_norm=args.clip_grad_norm,
                       checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, keep=args.keep,
                       resume=args.resume, device=args.device, backend=args.backend)


def _at_precision(plan: Plan, args: argparse.Namespace) -> Plan:
    """``plan`` at ``--precision`` when given; a note when that overrides a plan file's own."""
    if args.precision is None or args.precision == plan.precision:
        return plan
    if args.plan is not None and os.environ.get("RANK", "0") == "0":
        out.print(f"training at {args.precision}, not the plan's {plan.precision} (--precision)")
    return dataclasses.replace(plan, precision=args.precision)


def _note_optimizer(plan: Plan, args: argparse.Namespace) -> None:
    """One line when the run's optimizer or clipping is not what the plan's prediction priced (its STEP)."""
    clips = args.clip_grad_norm is not None
    if (args.optimizer, clips) == (plan.optimizer, plan.clip_grad_norm) or os.environ.get("RANK", "0") != "0":
        return
    out.print(f"training with {_stepping(args.optimizer, clips)}, but the plan's prediction priced the step of "
              f"{_stepping(plan.optimizer, plan.clip_grad_norm)} (`pipetrain plan --optimizer`, --clip-grad-norm)")


def _stepping(optimizer: str, clips: bool) -> str:
    return f"{optimizer}{' with clipping' if clips else ''}"


def _claim(args: argparse.Namespace, graph: LayerGraph, under_torchrun: bool) -> None:
    """``--out-dir`` becomes this run's (:mod:`pipetrain.cli.run_folder`); under torchrun each node's
    ranks write their own files and the folder is not checked (a refusal on one node would leave the
    others waiting)."""
    if not under_torchrun:
        claim_folder(args.out_dir, graph.name, graph.fingerprint(), overwrite=args.overwrite,
                     resume=args.resume is not None)


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
    first = result.metrics[0].step if result.metrics else 0
    if first > 0:
        last = first + len(result.losses) - 1
        out.print(f"resumed from the checkpoint of step {first}: trained steps {first} to {last}")
    steps, waits = len(result.losses), result.data_wait_s
    wait = f"data wait {statistics.median(waits[1:]) * 1e3:.2f} ms/step" if len(waits) > 1 else "data wait"
    out.print(f"trained {plan.model} for {steps} steps: loss {result.losses[0]:.4f} → {result.losses[-1]:.4f}, "
              f"{result.samples_per_s:.1f} samples/s (median step, slowest rank: "
              f"{result.timeline.iteration_s * 1e3:.1f} ms), "
              f"{wait} (first batch {waits[0]:.2f} s, loading the data)")
    if plan.precision == "fp16" and result.metrics:
        skipped = result.skipped_steps
        which = f": steps {', '.join(map(str, skipped))}" if skipped else ""
        out.print(f"fp16: {len(skipped)} of {steps} steps skipped on every stage (gradient overflow{which}), "
                  f"loss scale now {result.metrics[-1].loss_scale:g}")
    final = result.final_eval
    if final is not None and final.eval_loss is not None:
        accuracy = f", accuracy {final.eval_accuracy:.1%}" if final.eval_accuracy is not None else ""
        out.print(f"eval after step {final.step}: loss {final.eval_loss:.4f}{accuracy}")


def _summarise_memory(args: argparse.Namespace, graph: LayerGraph, plan: Plan, config: TrainConfig,
                      result: TrainResult, planned_with: Profile | None) -> None:
    """One line: each stage's peak memory as the memory model predicts it and as measured (on CUDA, the
    allocator's peak). The prediction needs only the profile's bytes: the one the run planned with,
    else ``--profile``'s, else estimated at the plan's precision (on the meta device, no timing); a
    profile the plan cannot use (another model or precision) gives "no prediction", not an error
    after training."""
    from pipetrain.profile.estimate import estimate_profile
    from pipetrain.simulate.memory import stage_memory
    from pipetrain.viz.peak_memory import peak_memory_line

    try:
        profile = planned_with or (Profile.load(args.profile) if args.profile is not None else
                                   estimate_profile(graph, "cpu", plan.batch_size, precision=plan.precision))
        cost = api.cost_of(plan, profile, api.local_cluster(plan.n_ranks), graph)
    except UserError as e:
        out.print(f"peak memory: no prediction ({escape(str(e))}); pass --profile to compare with the model")
        return
    predicted = stage_memory(plan, cost, optimizer=config.optimizer_state)
    out.print(escape(peak_memory_line(plan, predicted, result)))


def cmd_export(args: argparse.Namespace) -> None:
    from pipetrain.runtime.job.checkpoint import export_checkpoint

    checkpoint, tensors, size = export_checkpoint(args.checkpoint, args.out, with_heads=args.with_heads)
    model = escape(str(checkpoint.manifest.get("model")))
    out.print(f"exported {model} after step {checkpoint.step} ({escape(str(checkpoint.folder))}): {tensors} tensors, "
              f"{size:,} bytes of tensors → {escape(str(args.out))}")


def cmd_demo(args: argparse.Namespace) -> None:
    from pipetrain.demo import DemoSettings, run_demo

    run_demo(DemoSettings(args.model, args.batch, args.ranks, args.steps, args.out_dir), out, console)
