"""The ``pipetrain`` command: profile | probe | plan | simulate | train | compare | demo.

    pipetrain demo                                   # the whole loop on a built-in model
    pipetrain profile --model mlp --batch 128 --out profile.json
    pipetrain plan --model mlp --batch 128 --ranks 2 --profile profile.json --out plan.json
    pipetrain plan --model mlp --batch 128 --method uedp --planner tidgap --generations 200
    pipetrain plan --model vgg16 --batch 64 --cluster examples/clusters/4x4-v100.yaml --planner pipedream
    pipetrain plan --model gpt1-14 --batch 64 --cluster examples/clusters/2h100-2v100.yaml --planner auto
    pipetrain simulate --plan plan.json --profile profile.json --out sim/
    pipetrain train --plan plan.json --steps 20 --out run/
    pipetrain compare --plan plan.json --predicted sim/predicted.json --measured run/measured.json
    torchrun --nproc-per-node 2 -m pipetrain train --plan plan.json

A user's mistake prints one line naming the fix and exits with code 2 (DESIGN.md §5.5).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster
from pipetrain.errors import PipelineFailure, UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OPTIMIZER_STATE_COPIES
from pipetrain.plan.microbatch import GA_PLANNERS, PLANNER_NAMES, GAConfig
from pipetrain.plan.plan import Method, Plan
from pipetrain.profile.table import Profile
from pipetrain.simulate.timeline import Timeline

__all__ = ["main"]

console = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


# ---- shared argument groups ---------------------------------------------------------------------

def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gpt-tiny", help="zoo model name (default: gpt-tiny)")
    p.add_argument("--batch", type=int, default=32, help="samples per mini-batch (default: 32)")


def _cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, help="profile JSON (default: measure the model now)")
    p.add_argument("--estimate", metavar="DEVICE",
                   help="estimate the profile for a device model (cpu, v100, a100, h100, fpga)")
    p.add_argument("--cluster", type=Path, help="cluster spec YAML (see examples/clusters/) or JSON from `pipetrain "
                   "probe` (default: this machine)")
    p.add_argument("--ranks", type=int, help="number of ranks (default: the plan's, a spec's devices, or 2)")


def _load_profile(args: argparse.Namespace, graph_name: str, batch: int) -> Profile:
    if args.profile is not None:
        return Profile.load(args.profile)
    graph = api.resolve_model(graph_name)
    if args.estimate is None:
        console.print(f"[dim]profiling {graph.name} here (pass --profile to reuse a saved one)[/dim]")
    return api.profile_model(graph, batch, estimate=args.estimate, progress=True)


def _cluster_and_profiles(
    args: argparse.Namespace, graph_name: str, batch: int, n_ranks: int
) -> tuple[Cluster, api.Profiles]:
    """The cluster (``--cluster``: a YAML spec, a probe or plan-cluster JSON; default: this machine
    with ``n_ranks`` ranks) and its profiles (one per device kind for mixed clusters)."""
    if args.cluster is not None and args.cluster.suffix in (".yaml", ".yml"):
        if args.estimate is not None:
            raise UserError("--estimate: a cluster spec names each group's device model (and profile); drop --estimate")
        spec = api.load_cluster_spec(args.cluster, args.ranks)
        given = Profile.load(args.profile) if args.profile is not None else None
        return spec.cluster, api.cluster_profiles(api.resolve_model(graph_name), spec, batch, profile=given)
    cluster = api.local_cluster(n_ranks, args.cluster)
    if {d.kind for d in cluster.devices} == {"cpu"} or args.profile is not None or args.estimate is not None:
        return cluster, _load_profile(args, graph_name, batch)
    return cluster, api.cluster_profiles(api.resolve_model(graph_name), cluster, batch)


def _save(path: Path, text: str, what: str) -> None:
    write_atomic(path, text)
    console.print(f"[dim]wrote {what}: {path}[/dim]")


# ---- commands -----------------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> None:
    graph = api.resolve_model(args.model)
    profile = api.profile_model(graph, args.batch, estimate=args.estimate, progress=True, repeats=args.repeats)
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


def cmd_plan(args: argparse.Namespace) -> None:
    uedp = args.method == Method.UEDP.value
    partition = args.planner in api.PARTITION_PLANNERS
    ga = None if partition else _ga_config(args, uedp)
    graph = api.resolve_model(args.model)
    if partition and args.planner != "balanced":
        _plan_cluster(args, graph)
        return
    api.check_stage_count(graph, args.stages or args.ranks or 2)
    cluster, profile = _cluster_and_profiles(args, args.model, args.batch, args.ranks or 2)
    # uedp starts from the best equal plan (GPipe or 1F1B, balanced stages), as --method auto finds it
    method = None if args.method in ("auto", Method.UEDP.value) else Method(args.method)
    plan, candidates = api.plan_pipeline(
        graph, profile, cluster, batch_size=args.batch, method=method, n_stages=args.stages, n_micro=args.micro
    )
    from pipetrain.viz.plan_tables import candidates_table, plan_table

    if not uedp:
        _save(args.out, plan.to_json(), "plan")
        out.print(plan_table(plan))
        out.print(candidates_table(candidates, top=args.top))
        return
    if partition:
        raise UserError("--method uedp plans micro-batches with a micro-batch planner (tidgap, 1f1b-ga...); "
                        "--planner auto already tries them; drop --method uedp or choose a micro-batch planner")
    base = plan
    plan = api.plan_microbatches(base, profile, cluster, planner=args.planner or "tidgap", seed=args.seed or 0,
                                 ga=ga, memory_cap=args.memory_cap, progress=True)
    _save(args.out, plan.to_json(), "plan")
    caps, baselines = _uedp_references(base, profile, cluster, args.memory_cap)
    out.print(plan_table(plan, baselines=baselines, caps=caps))
    out.print(candidates_table(candidates, top=args.top, title="equal-micro-batch candidates (the baseline)"))


def _plan_cluster(args: argparse.Namespace, graph: LayerGraph) -> None:
    """``--planner pipedream | bapipe | auto``: plan, save, and show the plan and the runners-up."""
    if args.method not in ("auto",):
        raise UserError(f"--planner {args.planner} chooses the method itself; drop --method {args.method}")
    if args.micro is not None:
        raise UserError(f"--planner {args.planner} chooses the micro-batch count itself; drop --micro")
    cluster, profile = _cluster_and_profiles(args, args.model, args.batch, args.ranks or 2)
    result = api.plan_cluster(graph, profile, cluster, batch_size=args.batch, planner=args.planner,
                              n_stages=args.stages, seed=args.seed or 0, progress=True)
    from pipetrain.plan.auto import AutoResult
    from pipetrain.plan.bapipe import BapipeResult
    from pipetrain.viz.plan_tables import auto_table, bapipe_table, candidates_table, plan_table

    _save(args.out, result.plan.to_json(), "plan")
    if result.cluster.n_devices != cluster.n_devices:
        used = args.out.with_suffix(".cluster.json")
        _save(used, result.cluster.to_json(), f"the {result.cluster.n_devices} devices the plan uses")
        console.print(f"[dim]the plan leaves devices idle; pass --cluster {used} to simulate it[/dim]")
    out.print(plan_table(result.plan))
    if isinstance(result, AutoResult):
        out.print(auto_table(result))
    elif isinstance(result, BapipeResult):
        out.print(bapipe_table(result, top=args.top))
    else:
        out.print(f"PipeDream configuration {result.config} (replicas per stage)")
        out.print(candidates_table(list(result.candidates), top=args.top, title="pipedream candidates"))


def _uedp_references(
    base: Plan, profile: api.Profiles, cluster: Cluster, memory_cap: bool
) -> tuple[tuple[int | None, ...] | None, list[tuple[str, Plan]]]:
    """The memory caps a uedp plan was made under, and the plans to show its speedup over: the best
    equal plan and, when that one overflows some device, the best equal partition that fits."""
    if not memory_cap:
        return None, [("best equal plan", base)]
    from pipetrain.cost import CostModel
    from pipetrain.plan.microbatch import microbatch_caps, overflows

    cost = CostModel(profile, cluster)
    over = [k for k, _, _ in overflows(base, cost)]
    if not over:
        return microbatch_caps(base, cost), [("best equal plan", base)]
    fitting = api.plan_microbatches(base, profile, cluster, planner="equal")  # recomputing, within the caps
    return microbatch_caps(base, cost), [(f"best equal plan, over memory on stage {over[0]}", base),
                                         ("best equal plan within memory", fitting)]


def _ga_config(args: argparse.Namespace, uedp: bool) -> GAConfig | None:
    """The GA settings of `plan --method uedp`; a UserError for micro-batch options without it."""
    given = [f"--{name}" for name in ("planner", "seed", "population", "generations")
             if getattr(args, name) is not None]
    if not uedp:
        if given:
            raise UserError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for UMPIPE's unequal "
                            f"micro-batches: add --method uedp (--method is {args.method})")
        return None
    planner = args.planner or "tidgap"
    ga_only = [flag for flag in given if flag != "--planner"]
    if ga_only and planner not in GA_PLANNERS:
        raise UserError(f"{', '.join(ga_only)} only apply to the GA planners ({', '.join(GA_PLANNERS)}), "
                        f"not --planner {planner}; drop them or choose a GA planner")
    overrides = {name: getattr(args, name) for name in ("population", "generations") if getattr(args, name) is not None}
    try:
        return GAConfig(**overrides)
    except ValueError as e:
        raise UserError(f"bad GA settings: {e}; e.g. --population 64 --generations 200") from None


def _predict(args: argparse.Namespace, plan: Plan) -> tuple[Cluster, api.Profiles, Timeline]:
    cluster, profile = _cluster_and_profiles(args, plan.model, plan.batch_size, args.ranks or plan.n_ranks)
    schedule, predicted = api.predict(plan, profile, cluster)
    if getattr(args, "out", None) is not None:
        _save(args.out / "schedule.csv", schedule.to_csv(), "schedule")
    return cluster, profile, predicted


def cmd_simulate(args: argparse.Namespace) -> None:
    plan = Plan.from_json(_read(args.plan))
    cluster, profile, predicted = _predict(args, plan)
    _write_timeline(args.out, "predicted", predicted, plan)
    from pipetrain.cost import CostModel
    from pipetrain.plan.memory import stage_memory
    from pipetrain.plan.microbatch import device_memory
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
    if args.plan is not None:
        plan = Plan.from_json(_read(args.plan))
    else:
        plan, _ = api.plan_pipeline(
            api.resolve_model(args.model), _load_profile(args, args.model, args.batch),
            api.local_cluster(args.ranks or 2, args.cluster), batch_size=args.batch,
        )
    graph = api.graph_for_plan(plan)
    from pipetrain.runtime.train import TrainConfig, run_worker_from_env, train

    config = TrainConfig(steps=args.steps, optimizer=args.optimizer, lr=args.lr, data=args.data,
                         seed=args.seed, timeout_s=args.timeout, threads_per_rank=args.threads)
    if under_torchrun:
        result = run_worker_from_env(graph, plan, config)
        if result is None:  # not rank 0
            return
    else:
        result = train(graph, plan, config)
    _write_timeline(args.out, "measured", result.timeline, plan)
    out.print(f"trained {plan.model} for {args.steps} steps: final loss {result.losses[-1]:.4f}, "
              f"{result.samples_per_s:.1f} samples/s (median step {result.timeline.iteration_s * 1e3:.1f} ms)")


def cmd_compare(args: argparse.Namespace) -> None:
    plan = Plan.from_json(_read(args.plan))
    predicted, measured = Timeline.load(args.predicted), Timeline.load(args.measured)
    _show_comparison(plan, predicted, measured, args.out)


def _show_comparison(plan: Plan, predicted: Timeline, measured: Timeline, picture: Path) -> None:
    from pipetrain.viz.files import save_comparison
    from pipetrain.viz.tables import compare_table

    out.print(compare_table(predicted, measured, plan.rank_stages))
    save_comparison(picture, predicted, measured, plan.rank_stages)
    console.print(f"[dim]wrote predicted-vs-measured Gantt: {picture}[/dim]")


def cmd_demo(args: argparse.Namespace) -> None:
    from pipetrain.demo import run_demo

    run_demo(args.model, args.batch, args.ranks, args.steps, args.out, out, console)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UserError(f"no file at {path}; check the path") from None


# ---- parser -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipetrain", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[Callable[[argparse.Namespace], None], str]] = {
        "profile": (cmd_profile, "measure (or estimate) per-layer costs and write profile JSON"),
        "probe": (cmd_probe, "measure this machine's link and rank contention; write cluster JSON"),
        "plan": (cmd_plan, "choose stages, schedule and micro-batches by simulation; write plan JSON"),
        "simulate": (cmd_simulate, "predict a plan's timeline: table, Chrome trace, Gantt PNG"),
        "train": (cmd_train, "train with a plan on local ranks (or under torchrun)"),
        "compare": (cmd_compare, "show predicted beside measured: table and one picture"),
        "demo": (cmd_demo, "profile → plan → simulate → train → compare on a built-in model"),
    }
    parsers = {name: sub.add_parser(name, help=text, description=text) for name, (_, text) in commands.items()}
    for name, (func, _) in commands.items():
        parsers[name].set_defaults(func=func)
    _add_command_args(parsers)
    return parser


def _add_command_args(p: dict[str, argparse.ArgumentParser]) -> None:
    _model_args(p["profile"])
    p["profile"].add_argument("--estimate", metavar="DEVICE", help="estimate for a device model instead of measuring")
    p["profile"].add_argument("--repeats", type=int, default=5, help="timed repeats per point (median kept)")
    p["profile"].add_argument("--out", type=Path, default=Path("profile.json"))
    p["probe"].add_argument("--ranks", type=int, default=2, help="ranks of the local cluster (default 2)")
    p["probe"].add_argument("--probes", type=int, default=3, help="probes to take the median of (default 3)")
    p["probe"].add_argument("--overhead", type=float, default=CPU_ACTION_OVERHEAD_S, help="seconds per F/B action")
    p["probe"].add_argument("--out", type=Path, default=Path("cluster.json"))
    _model_args(p["plan"])
    _cost_args(p["plan"])
    p["plan"].add_argument("--method", default="auto",
                           choices=["auto", *(m.value for m in api.PLANNABLE_METHODS), Method.UEDP.value],
                           help="auto: the fastest of gpipe and 1f1b; uedp: UMPIPE's unequal micro-batches "
                                "per stage on the best equal plan's stages")
    p["plan"].add_argument("--planner", choices=[*api.PARTITION_PLANNERS, *PLANNER_NAMES],
                           help="balanced (default): exact min-max layer split, one stage per rank; pipedream: "
                                "PipeDream's DP with replicated stages; bapipe: BaPipe's exploration of method, "
                                "stages, micro-batches and device order (mixed devices); auto: every planner, the "
                                "fastest plan that fits; with --method uedp, a micro-batch planner (default tidgap)")
    p["plan"].add_argument("--seed", type=int, help="GA seed for --method uedp (default: 0)")
    defaults = GAConfig()
    p["plan"].add_argument("--population", type=int, help=f"GA population (default: {defaults.population})")
    p["plan"].add_argument("--generations", type=int, help=f"GA generations (default: {defaults.generations})")
    p["plan"].add_argument("--memory-cap", action=argparse.BooleanOptionalAction, default=True,
                           help="--method uedp: keep each stage's micro-batches within its device memory "
                                "(default: on)")
    p["plan"].add_argument("--stages", type=int, help="pipeline stages (default: one per rank)")
    p["plan"].add_argument("--micro", type=int, help="fix the number of micro-batches (default: search)")
    p["plan"].add_argument("--top", type=int, default=8, help="candidates to list")
    p["plan"].add_argument("--out", type=Path, default=Path("plan.json"))
    for name in ("simulate", "train", "compare"):
        p[name].add_argument("--plan", type=Path, required=name != "train", help="plan JSON")
    _cost_args(p["simulate"])
    p["simulate"].add_argument("--out", type=Path, default=Path("sim"))
    p["simulate"].add_argument("--optimizer", default="sgd", choices=list(OPTIMIZER_STATE_COPIES),
                               help="optimizer whose state the memory table counts (default: sgd)")
    _model_args(p["train"])
    _cost_args(p["train"])
    p["train"].add_argument("--steps", type=int, default=20)
    p["train"].add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p["train"].add_argument("--lr", type=float, default=0.01)
    p["train"].add_argument("--data", default="synthetic", choices=["synthetic", "digits"])
    p["train"].add_argument("--seed", type=int, default=0)
    p["train"].add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p["train"].add_argument("--timeout", type=float, default=60.0, help="seconds before a silent rank is failed")
    p["train"].add_argument("--out", type=Path, default=Path("run"))
    p["compare"].add_argument("--predicted", type=Path, required=True)
    p["compare"].add_argument("--measured", type=Path, required=True)
    p["compare"].add_argument("--out", type=Path, default=Path("compare.png"))
    p["demo"].add_argument("--model", default="mlp", help="zoo model (default: mlp)")
    p["demo"].add_argument("--batch", type=int, default=128)
    p["demo"].add_argument("--ranks", type=int, default=2)
    p["demo"].add_argument("--steps", type=int, default=12)
    p["demo"].add_argument("--out", type=Path, default=Path("out/demo"))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        args.func(args)
    except UserError as e:
        console.print(f"[bold red]error:[/bold red] {e}")
        return UserError.exit_code
    except PipelineFailure as e:
        console.print(f"[bold red]pipeline failed:[/bold red] {e}")
        return PipelineFailure.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
