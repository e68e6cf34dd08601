"""Typed training settings and results (STYLE.md L14): validated at construction, no hidden maths.

``TrainConfig`` holds how to train (steps, optimizer, data, launch settings); the *what* (model and
plan) is passed beside it. Gradient weighting is not a setting: the loss is always the sum of
per-sample losses divided by the batch size, once, which is what single-process training computes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from pipetrain.data import Loss, check_source_name, model_loss, resolve_loss
from pipetrain.device_select import (
    Backend,
    Device,
    DeviceChoice,
    check_backend,
    check_device_choice,
    resolve_backend,
    resolve_device,
)
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OPTIMIZER_NAMES, OptimizerName
from pipetrain.plan.plan import Plan
from pipetrain.profile.precision import Precision, parse_precision
from pipetrain.runtime.interp.memory import MeasuredMemory
from pipetrain.runtime.job.data import DataSource
from pipetrain.runtime.job.lr_rule import LRRule, StageRates, check_lr_rule, stage_rates
from pipetrain.runtime.job.metrics import MetricsRow
from pipetrain.runtime.job.optim import LRSchedule, OptimizerSettings, build_optimizer, check_lr_schedule, lr_at
from pipetrain.schedule.schedule import Schedule
from pipetrain.simulate.timeline import Timeline

__all__ = ["FaultInjection", "InjectedFault", "StepMetrics", "TrainConfig", "TrainJob", "TrainResult", "job_loss"]


@dataclass(frozen=True)
class FaultInjection:
    """A testing hook: make one rank fail on purpose, to check that the pipeline stops cleanly.

    The fault fires just before the middle action of the rank's program at optimizer step ``step``
    (a rank with an empty program never fires).

    Attributes:
        rank: the rank that fails.
        step: the optimizer step (0-based, warm-up steps included) at which it fails.
        kind: ``"raise"`` raises :class:`InjectedFault`; ``"kill"`` sends the rank SIGKILL;
            ``"interrupt"`` sends the rank SIGINT and goes on (a Ctrl-C mid-step that reached one
            rank: every rank stops at the next step's barrier); ``"overflow"`` (fp16 only) puts an
            inf in one gradient of the rank's stages at the step's STEP, a fake overflow that every
            stage must skip (:mod:`~pipetrain.runtime.job.loss_scale`).
    """

    rank: int
    step: int
    kind: Literal["raise", "kill", "interrupt", "overflow"] = "raise"

    def __post_init__(self) -> None:
        if self.kind not in ("raise", "kill", "interrupt", "overflow"):
            raise UserError(f"fault kind {self.kind!r} is unknown; use 'raise', 'kill' or 'interrupt' "
                            "(or 'overflow', a fake fp16 gradient overflow)")
        if self.rank < 0 or self.step < 0:
            raise UserError("fault rank and step must be >= 0")


class InjectedFault(RuntimeError):
    """Raised by :class:`FaultInjection` with ``kind="raise"``."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
        steps: optimizer steps (mini-batches) to run, warm-up included.
        epochs: when given, overrides ``steps``: ``epochs × (train samples // batch size)`` steps
            (data with a train set only; :func:`~pipetrain.runtime.process.worker.check_job` resolves it).
        warmup_steps: first steps left out of timing (the timeline and samples/s).
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"`` or ``"adamw"``
            (:data:`~pipetrain.plan.memory.OptimizerName`), one per stage over the stage's parameters.
        lr: learning rate.
        momentum: SGD momentum; None: 0.9 for ``"sgd-momentum"``, 0 for ``"sgd"`` (Adam takes none).
        weight_decay: None: 0.01 for ``"adamw"`` (decoupled), 0 for the others (an L2 term).
        lr_schedule: ``"constant"``, ``"cosine"`` or ``"warmup-cosine"`` over the steps
            (:func:`~pipetrain.runtime.job.optim.lr_at`); ``lr`` is the peak.
        lr_warmup_steps: linear warm-up steps of ``"warmup-cosine"``.
        lr_rule: ``"auto"`` scales each stage's rate for a method that steps more than once per batch
            (``pipedream``: by ``1/m``, ``m`` micro-batches, whatever the stage's replicas), ``"none"`` runs
            every stage at ``lr`` (:mod:`~pipetrain.runtime.job.lr_rule`; :meth:`stage_rates` has a plan's).
        clip_grad_norm: clip the gradient's global norm over all stages to this (as
            ``torch.nn.utils.clip_grad_norm_`` on the whole model; under ``2bw`` each batch's, under
            ``pipedream`` each update's own norm over its stage: docs/algorithms.md §3.5), or None.
        data: ``"synthetic"`` (from the model's tensor specs), ``"digits"`` (scikit-learn), ``"text"``
            (bytes of ``pydoc_data.topics``) or ``"module.path:callable"`` (see :mod:`pipetrain.data`).
        loss: ``"cross-entropy"``, ``"mse"``, ``"module.path:callable"``, or None for the model's own
            (see :mod:`pipetrain.data.loss`).
        eval_every: evaluate on the eval set every this many steps (0: only after the last step);
            data without an eval set (``synthetic``) is never evaluated.
        out: a folder for ``metrics.csv`` (one row per step, written as training goes), or None.
        checkpoint_dir: where checkpoints go (:mod:`pipetrain.runtime.job.checkpoint`), or None: after
            the last step, every ``checkpoint_every`` steps, and when a stop signal arrives.
        checkpoint_every: steps between checkpoints (0: only after the last step).
        keep: how many whole checkpoints to keep, newest first (None: all).
        resume: continue from the newest whole checkpoint in this folder, up to ``steps``; the
            plan may differ from the one that wrote it (the checkpoint is resharded).
        seed: data seed; also seeds torch's global generator on every rank.
        timeout_s: a rank that fails or stops answering makes every rank stop within this time.
        threads_per_rank: ``torch.set_num_threads`` in each rank (and in ``reference_train``).
        device: ``"cuda"``, ``"cpu"`` or ``"auto"``: CUDA when torch sees a GPU, unless ``backend`` is
            ``"gloo"`` (:mod:`pipetrain.device_select`); each rank takes the GPU of its local rank.
        backend: ``"gloo"`` or ``"nccl"``; None: NCCL on CUDA, gloo on the CPU. Gloo on CUDA runs (two
            ranks may then share a GPU) stages its messages through host memory.
        progress: show a progress bar (steps, loss, samples/s) in the launching process.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` overrides the plan's precision
            (:attr:`~pipetrain.plan.plan.Plan.precision`; :mod:`~pipetrain.runtime.interp.precision`);
            None trains at the plan's. :func:`~pipetrain.runtime.train.reference_train` trains at this
            (None: fp32).
        keep_freed_memory: keep freed CPU memory in each rank's heap instead of returning it to
            the OS, so steps do not page-fault their working set in again (see
            :mod:`pipetrain.allocator`; up to 14% faster on CPU; no effect on CUDA memory).
        fault: testing hook only: make a rank fail on purpose (see :class:`FaultInjection`).
    """

    steps: int = 10
    epochs: int | None = None
    warmup_steps: int = 1
    optimizer: OptimizerName = "sgd"
    lr: float = 0.01
    momentum: float | None = None
    weight_decay: float | None = None
    lr_schedule: LRSchedule = "constant"
    lr_warmup_steps: int = 0
    lr_rule: LRRule = "auto"
    clip_grad_norm: float | None = None
    data: DataSource = "synthetic"
    loss: str | None = None
    eval_every: int = 0
    out: Path | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    keep: int | None = None
    resume: Path | None = None
    seed: int = 0
    timeout_s: float = 60.0
    threads_per_rank: int = 1
    device: DeviceChoice = "auto"
    backend: Backend | None = None
    progress: bool = True
    precision: Precision | None = None
    keep_freed_memory: bool = True
    fault: FaultInjection | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or not 0 <= self.warmup_steps < self.steps:
            raise UserError(
                f"steps={self.steps}, warmup_steps={self.warmup_steps}: need steps >= 1 and "
                "0 <= warmup_steps < steps so that at least one step is timed"
            )
        if self.optimizer not in OPTIMIZER_NAMES:
            raise UserError(f"optimizer {self.optimizer!r} is unknown; use one of {', '.join(OPTIMIZER_NAMES)}")
        check_source_name(self.data)
        if self.epochs is not None and self.epochs < 1:
            raise UserError(f"epochs={self.epochs}: train for at least 1 epoch")
        if self.checkpoint_every < 0 or (self.keep is not None and self.keep < 1):
            raise UserError("--checkpoint-every must be >= 0 and --keep >= 1")
        if self.eval_every < 0:
            raise UserError(f"eval_every={self.eval_every}: give 0 (evaluate at the end) or a step count >= 1")
        check_device_choice(self.device)
        check_backend(self.backend, self.device)
        _ = self.optimizer_settings  # validates optimizer, lr, momentum, weight decay
        if self.epochs is None:  # else check_job checks it once the epochs are steps
            check_lr_schedule(self.lr_schedule, self.lr_warmup_steps, self.steps)
        check_lr_rule(self.lr_rule)
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise UserError(f"--clip-grad-norm {self.clip_grad_norm}: give a norm > 0")
        if self.timeout_s <= 0 or self.threads_per_rank < 1:
            raise UserError("timeout_s must be > 0 and threads_per_rank >= 1")
        if self.precision is not None:
            parse_precision(self.precision)
        if self.fault is not None and self.fault.step >= self.steps:
            raise UserError(f"fault step {self.fault.step} is past the last step {self.steps - 1}")

    def resolved_device(self) -> Device:
        """The device to compute on (``"auto"`` resolved; :func:`~pipetrain.device_select.resolve_device`).

        Raises:
            UserError: ``"cuda"`` where torch sees no GPU.
        """
        return resolve_device(self.device, self.backend)

    def resolved_backend(self) -> Backend:
        """The backend to use: as given, or NCCL on CUDA, gloo on the CPU."""
        return resolve_backend(self.resolved_device(), self.backend)

    @property
    def optimizer_settings(self) -> OptimizerSettings:
        """The optimizer and its hyper-parameters (validated)."""
        return OptimizerSettings(self.optimizer, self.lr, self.momentum, self.weight_decay)

    @property
    def optimizer_state(self) -> OptimizerName:
        """The optimizer as the memory model counts its state: ``"sgd"`` with momentum keeps a
        momentum buffer, like ``"sgd-momentum"``."""
        return self.optimizer_settings.state_name

    def build_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The configured optimizer over ``parameters`` (at the base learning rate)."""
        return build_optimizer(self.optimizer_settings, parameters)

    def lr_at(self, step: int) -> float:
        """The base learning rate of optimizer step ``step`` under the schedule (before :meth:`stage_rates`)."""
        return lr_at(step, self.steps, self.lr, self.lr_schedule, self.lr_warmup_steps)

    def stage_rates(self, plan: Plan) -> StageRates:
        """Each stage's factor on :meth:`lr_at` when ``plan`` trains under ``lr_rule``."""
        return stage_rates(plan, self.lr_rule)


@dataclass(frozen=True)
class TrainJob:
    """One training run: a model, a plan, settings; several jobs may share one launch.

    ``schedule`` is what every rank executes: a validated Schedule for ``plan`` (e.g. edited by
    hand, or the one the simulator scored), or None for the plan's own
    (:func:`~pipetrain.schedule.generators.build_schedule`); :func:`~pipetrain.runtime.process.worker.check_job`
    resolves and validates it before any rank starts.
    """

    graph: LayerGraph
    plan: Plan
    config: TrainConfig
    return_state_dict: bool = False
    schedule: Schedule | None = None


def job_loss(job: TrainJob) -> Loss:
    """The job's loss: ``config.loss`` resolved against the model's targets, or the model's own."""
    name = job.config.loss
    return model_loss(job.graph.loss) if name is None else resolve_loss(name, job.graph.target, job.graph.input)


@dataclass(frozen=True)
class StepMetrics(MetricsRow):
    """One optimizer step as the last stage measures it: a ``metrics.csv`` row (its ``wall_s``
    counts evaluation time too), and what the CSV leaves out.

    Attributes:
        step_s: this step's wall time on the last stage.
        data_wait_s: seconds the last stage waited for its batch.
        skipped: fp16: every stage skipped this step's update (a gradient overflowed somewhere).
        loss_scale: fp16: the loss scale after this step (:mod:`~pipetrain.runtime.job.loss_scale`); else None.
        previous_slowest_s: the slowest rank's wall time of the step before (learnt at this step's
            barrier; None at a run's first step): what :attr:`TrainResult.samples_per_s` is made of,
            so the progress bar reports the same speed.
    """

    step_s: float = 0.0
    data_wait_s: float = 0.0
    skipped: bool = False
    loss_scale: float | None = None
    previous_slowest_s: float | None = None


@dataclass(frozen=True)
class TrainResult:
    """What a training run measured.

    Attributes:
        losses: the mini-batch loss (mean over samples) of every step.
        step_times_s: every step's wall time (the slowest rank), warm-up included.
        samples_per_s: batch size / median time of the timed (non-warm-up) steps.
        timeline: the measured timeline of the median timed step (kind ``"measured"``).
        state_dict: the trained model's ``state_dict`` under the model's own names (parameters and
            buffers: BatchNorm's running statistics as the stage that owns the layer updated them,
            replica 0's for a replicated stage), on the CPU, when asked for; otherwise empty.
            ``model.load_state_dict(result.state_dict)`` loads it into the original module.
        memory: per rank of the plan, in rank order, the bytes it held at its peak (weights,
            gradients, optimizer state, activations); compare with ``pipetrain.simulate.memory.stage_memory``.
        device_peak_bytes: on CUDA, per rank of the plan, the CUDA allocator's peak over the run
            (``torch.cuda.max_memory_allocated``); empty on a CPU.
        metrics: every step's :class:`StepMetrics` (loss, learning rate, evaluations).
        data_wait_s: per step, the longest time a rank waited for its batch.
        checkpoint_s: per checkpoint written, the longest time a rank spent on it (writing its
            shard, and for rank 0 the manifest).
    """

    losses: tuple[float, ...]
    step_times_s: tuple[float, ...]
    samples_per_s: float
    timeline: Timeline
    state_dict: dict[str, torch.Tensor] = field(default_factory=dict)
    memory: tuple[MeasuredMemory, ...] = ()
    metrics: tuple[StepMetrics, ...] = ()
    data_wait_s: tuple[float, ...] = ()
    checkpoint_s: tuple[float, ...] = ()
    device_peak_bytes: tuple[int, ...] = ()

    @property
    def skipped_steps(self) -> tuple[int, ...]:
        """The steps whose update every stage skipped (fp16 overflows; none otherwise)."""
        return tuple(m.step for m in self.metrics if m.skipped)

    @property
    def final_eval(self) -> StepMetrics | None:
        """The last step that was evaluated, or None."""
        return next((m for m in reversed(self.metrics) if m.eval_loss is not None), None)
