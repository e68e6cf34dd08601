"""Every check of a command's arguments that needs no profile, run before any profiling or probing
(issue 32: a mistake costs one line at once, not a minute of measuring first).

    check_profile_args(args, graph)          # pipetrain profile
    check_probe_args(args, graph)            # pipetrain probe (graph: --model's, or None)
    check_plan_args(args, graph)             # pipetrain plan, after its --method/--planner route
    check_simulate_args(args, plan.method)   # pipetrain simulate, before the plan is re-cut or priced
    check_train_args(args, graph, config, planned)   # pipetrain train, before its folder is claimed

Each raises a :class:`~pipetrain.errors.UserError` naming the argument and the fix: files that do not
exist, an unknown device model, data or a loss that do not fit the model, a device torch does not
see, a ``--resume`` folder without a checkpoint of this model, counts that cannot go together
(micro-batches and batch, stages and ranks, layers and ranks), and flags of another method.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipetrain import api
from pipetrain.cli.rerun import check_rerun_flags
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import METHODS, Method
from pipetrain.plan.placement import Placement

if TYPE_CHECKING:
    from pipetrain.device_select import Backend, DeviceChoice
    from pipetrain.runtime.job.config import TrainConfig

__all__ = ["check_plan_args", "check_probe_args", "check_profile_args", "check_simulate_args", "check_train_args"]

_FILES = ("plan", "profile", "cluster", "schedule")
"""The options that name a file to read."""


def check_profile_args(args: argparse.Namespace, graph: LayerGraph) -> None:
    """`profile`: the device model, the data and loss against the model, and ``--device``."""
    _check_estimate(args)
    _check_data_and_loss(args, graph, args.data)
    if args.estimate is None:  # an estimate runs on the meta device
        _check_device(args.device)


def check_probe_args(args: argparse.Namespace, graph: LayerGraph | None) -> None:
    """`probe`: ``--calibrate`` needs ``--model``; the data and loss against it."""
    if args.calibrate and graph is None:
        raise UserError("--calibrate fits the terms to runs of your model: add --model (and --batch)")
    if graph is not None:
        _check_data_and_loss(args, graph, args.data)


def check_plan_args(args: argparse.Namespace, graph: LayerGraph) -> None:
    """`plan`: files, the device model, the data and loss, and the counts of layers, stages, ranks,
    micro-batches and samples (the ranks known before the cluster is read: ``--ranks``, or 2 without
    ``--cluster``)."""
    _check_files(args)
    _check_estimate(args)
    _check_data_and_loss(args, graph, args.data)
    ranks: int | None = args.ranks if args.ranks is not None or args.cluster is not None else 2
    api.check_stage_count(graph, args.stages or ranks or 2)
    if args.micro is not None and args.micro > args.batch:
        raise UserError(f"--micro {args.micro}: cannot split a batch of {args.batch} into {args.micro} micro-batches; "
                        f"choose between 1 and {args.batch}")
    if ranks is None:
        return
    if args.stages is not None and args.stages > ranks:
        raise UserError(f"--stages {args.stages}: {args.stages} stages need {args.stages} ranks but there are "
                        f"{ranks}; use fewer stages or more ranks (--ranks {args.stages})")
    _check_v_microbatches(args, graph, ranks)


def _check_v_microbatches(args: argparse.Namespace, graph: LayerGraph, ranks: int) -> None:
    """A method whose 2 chunks per rank each need a micro-batch (DualPipeV's warm-up) against ``--micro``."""
    if args.method is None or args.micro is None:
        return
    spec = METHODS[Method(args.method)]
    stages = 2 * min(ranks, len(graph.names) // 2)  # the interleaved planner keeps 2 layers per chunk
    if spec.placement is Placement.V and spec.microbatches_per_stage and args.micro < stages:
        raise UserError(f"--method {args.method} needs a micro-batch per stage, {stages} for {stages // 2} ranks "
                        f"(2 stages each, in a V), not --micro {args.micro}; give --micro {stages} or more, or drop "
                        "--micro")


def check_simulate_args(args: argparse.Namespace, planned: Method) -> None:
    """`simulate`: files, the device model and the re-run method's flags (against the plan's method,
    ``planned``)."""
    _check_files(args)
    _check_estimate(args)
    check_rerun_flags(args, planned)


def check_train_args(args: argparse.Namespace, graph: LayerGraph, config: TrainConfig, planned: Method | None
                     ) -> None:
    """`train`: files, the device model, the data and loss, the device, the checkpoint to resume, the
    layers against the ranks of a plan made here, and the re-run method's flags (``planned``: the
    plan file's method; None: train plans one here)."""
    _check_files(args)
    _check_estimate(args)
    _check_data_and_loss(args, graph, config.data)
    _check_device(config.device, config.backend)
    if args.resume is not None:
        from pipetrain.runtime.job.rank_checkpoint import resume_checkpoint

        resume_checkpoint(args.resume, graph, None if config.epochs is not None else config.steps)
    if args.plan is None:
        api.check_stage_count(graph, args.ranks or 2)
    check_rerun_flags(args, planned)


def _check_files(args: argparse.Namespace) -> None:
    for name in _FILES:
        path: Path | None = getattr(args, name, None)
        if path is not None and not path.is_file():
            raise UserError(f"no {name} at {path} (--{name}); check the path")


def _check_estimate(args: argparse.Namespace) -> None:
    if args.estimate is not None:
        from pipetrain.cluster import device_model

        device_model(args.estimate)


def _check_data_and_loss(args: argparse.Namespace, graph: LayerGraph, data: str | None) -> None:
    """``data`` (None: the model's own) and ``--loss`` against the model's inputs and targets."""
    from pipetrain.data import check_fits, resolve_loss

    if data is not None:
        check_fits(data, graph)
    if args.loss is not None:
        resolve_loss(args.loss, graph.target, graph.input)


def _check_device(choice: DeviceChoice, backend: Backend | None = None) -> None:
    """``--device cuda`` where torch sees no GPU."""
    from pipetrain.device_select import resolve_device

    resolve_device(choice, backend)
