"""What the commands share: the default model, and the model, profile, cluster,
plan-file and schedule-file loading every command does the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from pipetrain import api
from pipetrain.cli.consoles import console
from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile
from pipetrain.schedule.schedule import Schedule

__all__ = ["DEFAULT_MODEL", "cluster_and_profiles", "graph_of", "load_plan", "load_profile",
           "load_schedule", "read_text", "save_text"]

DEFAULT_MODEL = "gpt-tiny"


def graph_of(args: argparse.Namespace) -> LayerGraph:
    """The model ``--model`` names; a user's module is captured with ``--data``'s shapes."""
    model = args.model or DEFAULT_MODEL
    return api.resolve_model(model, data=args.data, loss=args.loss, leaf_modules=args.leaf or ())


def load_profile(args: argparse.Namespace, graph: LayerGraph, batch: int) -> Profile:
    if args.profile is not None:
        return Profile.load(args.profile)
    if args.estimate is None:
        console.print(f"[dim]profiling {graph.name} here (pass --profile to reuse a saved one)[/dim]")
    return api.profile_model(graph, batch, estimate=args.estimate, progress=True, loss=args.loss,
                             device=getattr(args, "device", "auto"))


def cluster_and_profiles(
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
        return cluster, load_profile(args, graph, batch)
    cluster = api.local_cluster(n_ranks, args.cluster)
    if {d.kind for d in cluster.devices} == {"cpu"} or args.profile is not None or args.estimate is not None:
        return cluster, load_profile(args, graph, batch)
    return cluster, api.cluster_profiles(graph, cluster, batch)


def save_text(path: Path, text: str, what: str) -> None:
    write_atomic(path, text)
    console.print(f"[dim]wrote {what}: {path}[/dim]")


def load_schedule(args: argparse.Namespace) -> Schedule | None:
    """``--schedule``: a schedule CSV (one row per rank, e.g. `simulate --out-dir`'s schedule.csv, edited)."""
    if args.schedule is None:
        return None
    text = read_text(args.schedule)
    try:
        return Schedule.from_csv(text)
    except (ValueError, UserError) as e:
        raise UserError(f"{args.schedule} is not a schedule CSV ({e}); write one row per rank of actions such as "
                        "0F0[0:16], 0SEND_F0[0:16]>1 (see `pipetrain simulate --out-dir`'s schedule.csv)") from None


def load_plan(path: Path) -> Plan:
    """A plan file (``--plan``); a malformed one is a UserError naming the file and the field."""
    text = read_text(path)
    try:
        return Plan.from_json(text)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UserError(f"no file at {path}; check the path") from None


