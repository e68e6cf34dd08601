"""The ``pipetrain`` command: profile | probe | plan | simulate | train | export | compare | demo.

    pipetrain demo                                   # the whole loop on a built-in model
    pipetrain profile --model mlp --batch 128 --out profile.json
    pipetrain plan --model mlp --batch 128 --ranks 2 --profile profile.json --out plan.json
    pipetrain plan --model mlp --batch 128 --method uedp --planner tidgap --generations 200
    pipetrain plan --model vgg16 --batch 64 --cluster examples/clusters/4x4-v100.yaml --planner pipedream
    pipetrain plan --model gpt1-14 --batch 64 --cluster examples/clusters/2h100-2v100.yaml --planner auto
    pipetrain simulate --plan plan.json --profile profile.json --out sim/
    pipetrain train --plan plan.json --steps 20 --out run/
    pipetrain export --checkpoint ckpt/ --out model.pt      # the newest checkpoint's state_dict
    pipetrain compare --plan plan.json --predicted sim/predicted.json --measured run/measured.json
    torchrun --nproc-per-node 2 -m pipetrain train --plan plan.json

A user's mistake prints one line naming the fix and exits with code 2 (DESIGN.md §5.5).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from pipetrain import __version__, api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.data import LOSS_NAMES, SOURCE_NAMES, default_source
from pipetrain.errors import Interrupted, PipelineFailure, UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import MODEL_NAMES
from pipetrain.plan.memory import OPTIMIZER_NAMES
from pipetrain.plan.plan import Method, Plan
from pipetrain.planners import PlannerSpec
from pipetrain.planners.microbatch import GA_PLANNERS, GAConfig
from pipetrain.profile.table import Profile
from pipetrain.runtime.optim import LR_SCHEDULES
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Timeline

if TYPE_CHECKING:
    from pipetrain.runtime.config import TrainResult

__all__ = ["main"]

console = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


DEFAULT_MODEL = "gpt-tiny"

# ---- shared argument groups ---------------------------------------------------------------------

def _count(text: str) -> int:
    """An argparse type: an integer >= 1 (a count of ranks, samples, steps...)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count; give an integer of at least 1")
    return value


def _non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"zoo model ({', '.join(MODEL_NAMES)}), or module.path:callable returning "
                   f"your nn.Module (default: {DEFAULT_MODEL})")
    p.add_argument("--batch", type=_count, default=32, help="samples per mini-batch (default: 32)")
    _data_args(p)


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf", action="append", metavar="module.path:Class",
                   help="keep this module class whole inside one layer when tracing your model (repeatable)")
    p.add_argument("--data", help=f"{', '.join(SOURCE_NAMES)} or module.path:callable returning (train, eval) "
                   "datasets (default: the model's own: digits for mlp-digits, text for gpt-tiny, else synthetic)")
    p.add_argument("--loss", help=f"{', '.join(LOSS_NAMES)} or module.path:callable (default: cross-entropy for "
                   "integer targets, mse for float ones)")


def _cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, help="profile JSON (default: measure the model now)")
    p.add_argument("--estimate", metavar="DEVICE",
                   help="estimate the profile for a device model (cpu, v100, a100, h100, fpga)")
    p.add_argument("--cluster", type=Path, help="cluster spec YAML (see examples/clusters/) or JSON from `pipetrain "
                   "probe` (default: this machine)")
    p.add_argument("--ranks", type=_count, help="number of ranks (default: the plan's, a spec's devices, or 2)")


def _graph(args: argparse.Namespace) -> LayerGraph:
    """The model ``--model`` names; a user's module is captured with ``--data``'s shapes."""
    model = args.model or DEFAULT_MODEL
    return api.resolve_model(model, data=args.data, loss=args.loss, leaf_modules=args.leaf or ())


def _load_profile(args: argparse.Namespace, graph: LayerGraph, batch: int) -> Profile:
    if args.profile is not None:
        return Profile.load(args.profile)
    if args.estimate is None:
        console.print(f"[dim]profiling {graph.name} here (pass --profile to reuse a saved one)[/dim]")
    return api.profile_model(graph, batch, estimate=args.estimate, progress=True, loss=args.loss)


def _cluster_and_profiles(
    args: argparse.Namespace, graph: LayerGraph, batch: int, n_ranks: int
) -> tuple[Cluster, api.Profiles]:
    """The cluster (``--cluster``: a YAML spec, a probe or plan-cluster JSON; default: this machine
    with ``n_ranks`` ranks) and its profiles (one per device kind for mixed clusters)."""
    if args.cluster is not None and args.cluster.suffix in (".yaml", ".yml"):
        if args.estimate is not None:
            raise UserError("--estimate: a cluster spec names each group's device model (and profile); drop --estimate")
        spec = api.load_cluster_spec(args.cluster, args.ranks)
        given = Profile.load(args.profile) if args.profile is not None else None
        return spec.cluster, api.cluster_profiles(graph, spec, batch, profile=given)
    if args.cluster is None and args.estimate is not None:
        cluster, assumed = api.estimated_cluster(args.estimate, n_ranks)
        console.print(f"[dim]cluster: {escape(assumed)}[/dim]")
        return cluster, _load_profile(args, graph, batch)
    cluster = api.local_cluster(n_ranks, args.cluster)
    if {d.kind for d in cluster.devices} == {"cpu"} or args.profile is not None or args.estimate is not None:
        return cluster, _load_profile(args, graph, batch)
    return cluster, api.cluster_profiles(graph, cluster, batch)


def _save(path: Path, text: str, what: str) -> None:
    write_atomic(path, text)
    console.print(f"[dim]wrote {what}: {path}[/dim]")


# ---- commands -----------------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> None:
    graph = _graph(args)
    profile = api.profile_model(graph, args.batch, estimate=args.estimate, progress=True, repeats=args.repeats,
                                loss=args.loss)
    _save(args.out, profile.to_json(), "profile")
    from pipetrain.viz.plan_tables import profile_table

    out.print(profile_table(profile))


def cmd_probe(args: argparse.Namespace) -> None:
    from pipetrain.profile.link import probe_cluster

    cluster = probe_cluster(args.ranks, probes=args.probes, action_overhead_s=args.overhead)
    _save(args.out, cluster.to_json(), "cluster")
    link = cluster.intra_node
    out.print(
        f"link: latency {link.latency_s * 1e6:.0f} µs, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
        f"two ranks computing at once each run at {cluster.concurrency_speed(2):.2f}× their speed alone "
        f"(median of {args.probes} probes)"
    )


_CONSTRAINT_FLAGS = {"method": "--method", "n_stages": "--stages", "n_micro": "--micro",
                     "memory_cap": "--no-memory-cap", "seed": "--seed", "ga": "--population/--generations",
                     "base": "--base"}


def _planner_name(args: argparse.Namespace) -> str:
    """The registry name `plan`'s --method and --planner select; a UserError for combinations that
    do not go together (checked before any profiling)."""
    uedp = args.method == Method.UEDP.value
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
    return str(args.planner or "tidgap")


def _plan_constraints(args: argparse.Namespace, spec: PlannerSpec) -> api.Constraints:
    """`plan`'s flags as the planner's constraints; a UserError naming the flags it does not take."""
    overrides = {name: getattr(args, name) for name in ("population", "generations") if getattr(args, name) is not None}
    try:
        ga = GAConfig(**overrides) if overrides else None
    except ValueError as e:
        raise UserError(f"bad GA settings: {e}; e.g. --population 64 --generations 200") from None
    fixed = args.method if args.method in (m.value for m in api.PLANNABLE_METHODS) else None
    constraints = api.Constraints(method=None if fixed is None else Method(fixed), n_stages=args.stages,
                                  n_micro=args.micro, memory_cap=args.memory_cap, seed=args.seed or 0, ga=ga)
    ignored = [_CONSTRAINT_FLAGS[name] for name in spec.ignored(constraints)]
    if ignored and spec.kind == "microbatch":
        raise UserError(f"{', '.join(ignored)} only apply to the GA planners ({', '.join(GA_PLANNERS)}), not "
                        f"--planner {spec.name}; drop them or choose a GA planner")
    if ignored:
        raise UserError(f"--planner {spec.name} chooses {', '.join(ignored)} itself or does not use "
                        f"{'it' if len(ignored) == 1 else 'them'}; drop {', '.join(ignored)}")
    return constraints


def cmd_plan(args: argparse.Namespace) -> None:
    spec = api.get_planner(_planner_name(args))
    constraints = _plan_constraints(args, spec)
    graph = _graph(args)
    api.check_stage_count(graph, args.stages or args.ranks or 2)
    cluster, profile = _cluster_and_profiles(args, graph, args.batch, args.ranks or 2)
    result = api.plan(graph, profile, cluster, batch_size=args.batch, planner=spec.name, optimizer=args.optimizer,
                      constraints=constraints, progress=True)
    _save(args.out, result.plan.to_json(), "plan")
    if result.cluster.n_devices != cluster.n_devices:
        used = args.out.with_suffix(".cluster.json")
        _save(used, result.cluster.to_json(), f"the {result.cluster.n_devices} devices the plan uses")
        console.print(f"[dim]the plan leaves devices idle; pass --cluster {used} to simulate it[/dim]")
    from pipetrain.viz.plan_tables import result_tables

    for table in result_tables(result, top=args.top):
        out.print(table)


def _predict(args: argparse.Namespace, plan: Plan) -> tuple[Cluster, api.Profiles, Timeline]:
    n_ranks = args.ranks or plan.n_ranks
    if n_ranks < plan.n_ranks:
        raise UserError(f"the plan uses {plan.n_ranks} ranks but --ranks is {n_ranks}; pass --ranks {plan.n_ranks}")
    graph = api.graph_for_plan(plan, data=args.data, leaf_modules=args.leaf or ())
    cluster, profile = _cluster_and_profiles(args, graph, plan.batch_size, n_ranks)
    schedule, predicted = api.predict(plan, profile, cluster, schedule=_load_schedule(args))
    if getattr(args, "out", None) is not None:
        _save(args.out / "schedule.csv", schedule.to_csv(), "schedule")
    return cluster, profile, predicted


def cmd_simulate(args: argparse.Namespace) -> None:
    plan = Plan.from_json(_read(args.plan))
    cluster, profile, predicted = _predict(args, plan)
    _write_timeline(args.out, "predicted", predicted, plan)
    from pipetrain.cost import CostModel
    from pipetrain.simulate.memory import device_memory, stage_memory
    from pipetrain.viz.tables import memory_table, timeline_table

    out.print(timeline_table(predicted, plan.rank_stages))
    cost = CostModel(profile, cluster)
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
        plan = Plan.from_json(_read(args.plan))
        if args.model is not None and args.model != plan.model:
            raise UserError(f"--model {args.model} but {args.plan} was made for {plan.model}; drop --model to train "
                            f"the plan's model, or plan anew with --model {args.model}")
        graph = api.graph_for_plan(plan, data=args.data, leaf_modules=args.leaf or ())
    else:
        graph = _graph(args)
        plan, _ = api.plan_pipeline(graph, _load_profile(args, graph, args.batch),
                                    api.local_cluster(args.ranks or 2, args.cluster), batch_size=args.batch)
    schedule = _load_schedule(args)
    from pipetrain.runtime.train import TrainConfig, run_worker_from_env, train

    config = TrainConfig(steps=20 if args.steps is None else args.steps, epochs=args.epochs, optimizer=args.optimizer,
                         lr=args.lr, data=args.data or default_source(graph), loss=args.loss,
                         eval_every=args.eval_every, seed=args.seed, timeout_s=args.timeout,
                         threads_per_rank=args.threads, out=args.out, momentum=args.momentum,
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
    _write_timeline(args.out, "measured", result.timeline, plan)
    _summarise_training(plan, result)
    _plot_losses(args.out, result, f"{plan.model} on {config.data}")


def _plot_losses(folder: Path, result: TrainResult, title: str) -> None:
    """``loss.png`` from ``metrics.csv`` (a resumed run's earlier steps included), else from the result
    (under torchrun the last stage may have written the CSV on another node)."""
    from pipetrain.runtime.metrics import METRICS_FILE, read_metrics
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
    plan = Plan.from_json(_read(args.plan))
    predicted, measured = Timeline.load(args.predicted), Timeline.load(args.measured)
    for flag, timeline, kind in (("--predicted", predicted, "predicted"), ("--measured", measured, "measured")):
        if timeline.n_ranks != plan.n_ranks:
            raise UserError(f"{flag} has {timeline.n_ranks} ranks but the plan {plan.n_ranks}; compare the timelines "
                            "of this plan (`pipetrain simulate` and `train` with --plan)")
        if timeline.kind != kind:
            raise UserError(f"{flag} is a {timeline.kind} timeline; pass the {kind} one (`pipetrain "
                            f"{'simulate' if kind == 'predicted' else 'train'} --out` writes {kind}.json)")
    _show_comparison(plan, predicted, measured, args.out)


def _show_comparison(plan: Plan, predicted: Timeline, measured: Timeline, picture: Path) -> None:
    from pipetrain.viz.files import save_comparison
    from pipetrain.viz.tables import compare_table

    out.print(compare_table(predicted, measured, plan.rank_stages))
    save_comparison(picture, predicted, measured, plan.rank_stages)
    console.print(f"[dim]wrote predicted-vs-measured Gantt: {picture}[/dim]")


def cmd_export(args: argparse.Namespace) -> None:
    from pipetrain.runtime.checkpoint import export_checkpoint

    checkpoint, tensors, size = export_checkpoint(args.checkpoint, args.out)
    model = escape(str(checkpoint.manifest.get("model")))
    out.print(f"exported {model} after step {checkpoint.step} ({escape(str(checkpoint.folder))}): {tensors} tensors, "
              f"{size:,} bytes of tensors → {escape(str(args.out))}")


def cmd_demo(args: argparse.Namespace) -> None:
    from pipetrain.demo import DemoSettings, run_demo

    run_demo(DemoSettings(args.model, args.batch, args.ranks, args.steps, args.out), out, console)


def _load_schedule(args: argparse.Namespace) -> Schedule | None:
    """``--schedule``: a schedule CSV (one row per rank, e.g. `simulate --out`'s schedule.csv, edited)."""
    if args.schedule is None:
        return None
    text = _read(args.schedule)
    try:
        return Schedule.from_csv(text)
    except (ValueError, UserError) as e:
        raise UserError(f"{args.schedule} is not a schedule CSV ({e}); write one row per rank of actions such as "
                        "0F0[0:16], 0SEND_F0[0:16]>1 (see `pipetrain simulate --out`'s schedule.csv)") from None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UserError(f"no file at {path}; check the path") from None


# ---- parser -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipetrain", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"pipetrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    Command = tuple[Callable[[argparse.Namespace], None], str, Callable[[argparse.ArgumentParser], None]]
    commands: dict[str, Command] = {
        "profile": (cmd_profile, "measure (or estimate) per-layer costs and write profile JSON", _profile_args),
        "probe": (cmd_probe, "measure this machine's link and rank contention; write cluster JSON", _probe_args),
        "plan": (cmd_plan, "choose stages, schedule and micro-batches by simulation; write plan JSON", _plan_args),
        "simulate": (cmd_simulate, "predict a plan's timeline: table, Chrome trace, Gantt PNG", _simulate_args),
        "train": (cmd_train, "train with a plan on local ranks (or under torchrun)", _train_args),
        "compare": (cmd_compare, "show predicted beside measured: table and one picture", _compare_args),
        "export": (cmd_export, "write the newest checkpoint's model state_dict (for load_state_dict)", _export_args),
        "demo": (cmd_demo, "profile → plan → simulate → train → compare on a built-in model", _demo_args),
    }
    for name, (func, text, add_args) in commands.items():
        command = sub.add_parser(name, help=text, description=text)
        command.set_defaults(func=func, parser=command)
        add_args(command)
    return parser


def _profile_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    p.add_argument("--estimate", metavar="DEVICE", help="estimate for a device model instead of measuring")
    p.add_argument("--repeats", type=_count, default=5, help="timed repeats per point (median kept)")
    p.add_argument("--out", type=Path, default=Path("profile.json"))


def _probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=_count, default=2, help="ranks of the local cluster (default 2)")
    p.add_argument("--probes", type=_count, default=3, help="probes to take the median of (default 3)")
    p.add_argument("--overhead", type=float, default=CPU_ACTION_OVERHEAD_S, help="seconds per F/B action")
    p.add_argument("--out", type=Path, default=Path("cluster.json"))


def _plan_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _cost_args(p)
    p.add_argument("--method", default="auto", choices=["auto", *(m.value for m in api.PLANNABLE_METHODS),
                                                         Method.UEDP.value],
                   help="auto: the fastest of gpipe and 1f1b; uedp: UMPIPE's unequal micro-batches "
                        "per stage on the best equal plan's stages")
    p.add_argument("--planner", choices=list(api.PLANNERS),
                   help="balanced (default): exact min-max layer split, one stage per rank; pipedream: "
                        "PipeDream's DP with replicated stages; bapipe: BaPipe's exploration of method, "
                        "stages, micro-batches and device order (mixed devices); auto: every planner, the "
                        "fastest plan that fits; with --method uedp, a micro-batch planner (default tidgap)")
    p.add_argument("--seed", type=_non_negative, help="GA seed for --method uedp, bapipe and auto (default: 0)")
    defaults = GAConfig()
    p.add_argument("--population", type=_count, help=f"GA population (default: {defaults.population})")
    p.add_argument("--generations", type=_count, help=f"GA generations (default: {defaults.generations})")
    p.add_argument("--memory-cap", action=argparse.BooleanOptionalAction, default=True,
                   help="--method uedp: keep each stage's micro-batches within its device memory (default: on)")
    p.add_argument("--stages", type=_count, help="pipeline stages (default: one per rank)")
    p.add_argument("--micro", type=_count, help="fix the number of micro-batches (default: search)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZER_NAMES,
                   help="optimizer whose state counts against device memory (default: sgd)")
    p.add_argument("--top", type=_count, default=8, help="candidates to list")
    p.add_argument("--out", type=Path, default=Path("plan.json"))


def _plan_and_schedule_args(p: argparse.ArgumentParser, *, plan_required: bool) -> None:
    p.add_argument("--plan", type=Path, required=plan_required, help="plan JSON")
    p.add_argument("--schedule", type=Path, help="schedule CSV to run instead of the plan's own (one row per rank, "
                   "e.g. simulate's schedule.csv, edited); validated against the plan")


def _simulate_args(p: argparse.ArgumentParser) -> None:
    _plan_and_schedule_args(p, plan_required=True)
    _cost_args(p)
    _data_args(p)
    p.add_argument("--out", type=Path, default=Path("sim"))
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZER_NAMES,
                   help="optimizer whose state the memory table counts (default: sgd)")


def _train_args(p: argparse.ArgumentParser) -> None:
    _plan_and_schedule_args(p, plan_required=False)
    _model_args(p)
    _cost_args(p)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_count, help="optimizer steps in total (default: 20)")
    length.add_argument("--epochs", type=_count, help="passes over the train set (instead of --steps)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZER_NAMES)
    p.add_argument("--lr", type=float, default=0.01, help="learning rate, the peak of a schedule (default: 0.01)")
    p.add_argument("--momentum", type=float, help="SGD momentum (default: 0.9 for sgd-momentum, else 0)")
    p.add_argument("--weight-decay", type=float, help="weight decay (default: 0.01 for adamw, else 0)")
    p.add_argument("--lr-schedule", default="constant", choices=LR_SCHEDULES, help="(default: constant)")
    p.add_argument("--warmup-steps", type=_non_negative, default=0, help="linear warm-up steps of warmup-cosine")
    p.add_argument("--clip-grad-norm", type=float, metavar="X",
                   help="clip the gradient's global norm over all stages to X (default: no clipping)")
    p.add_argument("--eval-every", type=_non_negative, default=0, metavar="K",
                   help="evaluate on the eval set every K steps (default: only after the last step)")
    p.add_argument("--seed", type=_non_negative, default=0)
    p.add_argument("--threads", type=_count, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent rank is failed")
    p.add_argument("--out", type=Path, default=Path("run"),
                   help="folder for metrics.csv, loss.png and the measured timeline (default: run)")
    p.add_argument("--checkpoint-dir", type=Path, metavar="D",
                   help="write checkpoints to D: after the last step, every --checkpoint-every steps, and on Ctrl-C")
    p.add_argument("--checkpoint-every", type=_non_negative, default=0, metavar="K",
                   help="steps between checkpoints (default: only after the last step)")
    p.add_argument("--keep", type=_count, metavar="N", help="keep the newest N checkpoints (default: all)")
    p.add_argument("--resume", type=Path, metavar="D",
                   help="continue from the newest whole checkpoint in D up to --steps/--epochs (any plan)")


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, required=True, metavar="D",
                   help="a train --checkpoint-dir: its newest whole checkpoint is exported")
    p.add_argument("--out", type=Path, default=Path("model.pt"),
                   help="torch.save'd state_dict under the model's own names (default: model.pt)")


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", type=Path, required=True, help="plan JSON")
    p.add_argument("--predicted", type=Path, required=True)
    p.add_argument("--measured", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("compare.png"))


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gpt-tiny",
                   help="zoo model; trains on the built-in data it fits (default: gpt-tiny on text)")
    p.add_argument("--batch", type=_count, default=32)
    p.add_argument("--ranks", type=_count, default=2)
    p.add_argument("--steps", type=_count, default=300)
    p.add_argument("--out", type=Path, default=Path("out/demo"))


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line; an unknown flag gets one line naming the nearest known one."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command: argparse.ArgumentParser = args.parser
        known = [o for action in command._actions for o in action.option_strings]
        close = difflib.get_close_matches(extra[0].partition("=")[0], known, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; see `pipetrain {args.command} --help`"
        command.error(f"unrecognized argument {extra[0]}{hint}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        args.func(args)
    except UserError as e:
        console.print(f"[bold red]error:[/bold red] {escape(str(e))}")
        return UserError.exit_code
    except PipelineFailure as e:
        console.print(f"[bold red]pipeline failed:[/bold red] {escape(str(e))}")
        return PipelineFailure.exit_code
    except OSError as e:  # a file or folder that cannot be read or written: --out, --plan, --profile ...
        where = f": {e.filename}" if e.filename else ""
        console.print(f"[bold red]error:[/bold red] {escape(e.strerror or str(e))}{escape(str(where))}; check the path "
                      "(an --out folder must not be an existing file, and its parent must be writable)")
        return UserError.exit_code
    except Interrupted as e:
        console.print(f"[bold yellow]stopped:[/bold yellow] {escape(str(e))}")
        return e.exit_code
    except KeyboardInterrupt:
        console.print("[bold yellow]stopped:[/bold yellow] interrupted (Ctrl-C)")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
