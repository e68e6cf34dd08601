"""What the commands share: the default model, and the model, profile, cluster,
plan-file and schedule-file loading every command does the same way."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape

from pipetrain import api
from pipetrain.cli.consoles import console
from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.plan import Plan
from pipetrain.profile.precision import Precision, parse_precision
from pipetrain.profile.table import Profile
from pipetrain.schedule.schedule import Schedule

__all__ = ["DEFAULT_MODEL", "cluster_and_profiles", "graph_of", "load_plan", "load_profile", "load_schedule",
           "read_text", "save_text", "use_calibration_profile", "use_plan_measurements"]

DEFAULT_MODEL = "gpt-tiny"


def graph_of(args: argparse.Namespace) -> LayerGraph:
    """The model ``--model`` names; a user's module is captured with ``--data``'s shapes."""
    model = args.model or DEFAULT_MODEL
    return api.resolve_model(model, data=args.data, loss=args.loss, leaf_modules=args.leaf or ())


def load_profile(args: argparse.Namespace, graph: LayerGraph, batch: int, precision: Precision | None = None
                 ) -> Profile:
    """The profile at ``precision`` (None: :func:`_precision`): ``--profile``'s (refused at another
    precision), else estimated (``--estimate``) or measured here at it."""
    precision = precision or _precision(args)
    if args.profile is not None:
        return Profile.load(args.profile).check_precision(precision, str(args.profile))
    if args.estimate is None:
        console.print(f"[dim]profiling {graph.name} here at {precision} (pass --profile to reuse a saved one)[/dim]")
    return api.profile_model(graph, batch, estimate=args.estimate, progress=True, loss=args.loss,
                             device=getattr(args, "device", "auto"), precision=precision)


def _precision(args: argparse.Namespace) -> Precision:
    """The precision a command plans at: its ``--precision`` (``plan``, ``train``), else fp32."""
    return parse_precision(getattr(args, "precision", None) or "fp32")


def cluster_and_profiles(
    args: argparse.Namespace, graph: LayerGraph, batch: int, n_ranks: int, precision: Precision | None = None,
    *, machine: Callable[[], Cluster | None] | None = None,
) -> tuple[Cluster, api.Profiles]:
    """The cluster (``--cluster``: a YAML spec, a probe or plan-cluster JSON; default: this machine
    with ``n_ranks`` ranks: ``machine()`` when it gives one (``plan``'s probe, asked once the profile
    is in hand, so a bad ``--profile`` fails before a probe), else its defaults) and its profiles (one
    per device kind for mixed clusters), at the plan's ``precision`` (None: the command's,
    :func:`_precision`; :func:`load_profile`, :func:`pipetrain.api.cluster_profiles`)."""
    precision = precision or _precision(args)
    if args.cluster is not None and args.cluster.suffix in (".yaml", ".yml"):
        if args.estimate is not None:
            raise UserError("--estimate: a cluster spec names each group's device model (and profile); drop --estimate")
        spec = api.load_cluster_spec(args.cluster, args.ranks)
        given = Profile.load(args.profile) if args.profile is not None else None
        return spec.cluster, api.cluster_profiles(graph, spec, batch, profile=given, precision=precision)
    if args.cluster is None and args.estimate is not None:
        cluster, assumed = api.estimated_cluster(args.estimate, n_ranks)
        console.print(f"[dim]cluster: {escape(assumed)}[/dim]")
        return cluster, load_profile(args, graph, batch, precision)
    cluster = api.local_cluster(n_ranks, args.cluster)
    if {d.kind for d in cluster.devices} == {"cpu"} or args.profile is not None or args.estimate is not None:
        profile_given = args.profile is not None or args.estimate is not None
        probed = None
        if not profile_given:  # probed before profiling: a calibrated probe (or --cluster's file) brings its profile
            probed = machine() if machine is not None else None
            use_calibration_profile(args, args.cluster, precision)
        profile = load_profile(args, graph, batch, precision)
        if profile_given and machine is not None:  # probed once the given profile loads: a bad file fails first
            probed = machine()
        return probed or cluster, profile
    return cluster, api.cluster_profiles(graph, cluster, batch, precision=precision)


def use_calibration_profile(args: argparse.Namespace, cluster_file: Path | None, precision: Precision) -> None:
    """Point ``args.profile`` at the profile ``cluster_file`` was calibrated against, where one lies
    beside it at ``precision`` (:func:`~pipetrain.calibrate.machine.calibration_profile_path`): the
    calibrated speed holds for that profile, not for one measured again. One line when the calibration's
    runs trained with another optimizer than ``args.optimizer``: its fit holds for that one's steps."""
    from pipetrain.calibrate.machine import calibrated_optimizer, calibration_profile_path

    if cluster_file is None or not calibration_profile_path(cluster_file).exists():
        return
    calibrated_with, planned = calibrated_optimizer(cluster_file), getattr(args, "optimizer", None)
    if planned is not None and calibrated_with != planned:
        console.print(f"note: {escape(str(cluster_file))} was calibrated on runs training with {calibrated_with}, "
                      f"not {planned}: its fit holds for {calibrated_with}'s steps (calibrate again with `pipetrain "
                      f"probe --model M --calibrate --optimizer {planned}`)")
    companion = calibration_profile_path(cluster_file)
    try:
        same = Profile.load(companion).precision == precision
    except UserError:
        same = False
    if same:
        args.profile = companion
        console.print(f"[dim]profile: {escape(str(companion))}, the one {escape(str(cluster_file))} was calibrated "
                      "against (--profile to price with another)[/dim]")


def use_plan_measurements(args: argparse.Namespace, plan: Plan, plan_path: Path) -> list[str]:
    """Point ``args.profile`` and ``args.cluster`` at the profile and cluster ``plan`` was made with
    (:attr:`~pipetrain.plan.plan.Plan.measurements`, beside ``plan_path``), so a command prices the
    plan on the very numbers it was chosen with. A flag given (``--profile``, ``--cluster``;
    ``--estimate`` for both) wins; a recorded file that is missing is left out, and the command
    measures (or takes this machine's defaults) as without a plan.

    Returns:
        one line for each of those (dim, but for a missing file) and one for what is reused, for the
        console once the command's options are checked (a mistake's error stays the only line).
    """
    sources = plan.measurements
    if sources is None:
        return []
    notes, reused = [], []
    for flag, recorded in (("profile", sources.profile), ("cluster", sources.cluster)):
        if recorded is None:
            continue
        path = Path(os.path.normpath(plan_path.parent / recorded))  # a spec's ../ resolved, for the notes
        given = getattr(args, flag)
        if given is not None or args.estimate is not None:
            instead = f"--{flag} {given}" if given is not None else f"--estimate {args.estimate}"
            notes.append(f"[dim]{escape(instead)} instead of the plan's {flag} {escape(str(path))}[/dim]")
        elif not path.exists():
            fallback = "measuring the model here" if flag == "profile" else "taking this machine's defaults"
            notes.append(f"the plan's {flag} {escape(str(path))} is missing: {fallback} (pass --{flag} to give one)")
        else:
            setattr(args, flag, path)
            reused.append(f"{flag} {escape(str(path))}")
    if reused:
        notes.append(f"[dim]costs: the plan's {' and '.join(reused)}[/dim]")
    return notes


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


