"""Optimizers, learning-rate schedules and gradient clipping across pipeline stages.

    settings = OptimizerSettings("adamw", lr=3e-4)               # weight decay 0.01 (AdamW's default)
    optimizer = build_optimizer(settings, stage.parameters())    # one per stage
    for step in range(steps):
        set_lr(optimizer, lr_at(step, steps, settings.lr, "warmup-cosine", warmup_steps=10))
        ...                                                      # forward, backward, replica all-reduce
        clip_grad_norm_global(params, 1.0, world=dist.group.WORLD, replicas=len(stage.ranks))
        optimizer.step()

Every stage runs its own optimizer over its own parameters; since the optimizers are elementwise, that
equals one optimizer over the whole model. Gradient clipping is not elementwise: it needs the norm of
the *whole* model's gradient, which :func:`clip_grad_norm_global` gathers from every stage with one
all-reduce, so pipelined training clips exactly as single-process training does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError
from pipetrain.plan.memory import OPTIMIZER_NAMES, OptimizerName
from pipetrain.profile.optimizer_step import ADAMW_WEIGHT_DECAY, SGD_MOMENTUM, torch_optimizer

__all__ = [
    "ADAMW_WEIGHT_DECAY",
    "LR_SCHEDULES",
    "SGD_MOMENTUM",
    "ClipNorm",
    "LRSchedule",
    "OptimizerSettings",
    "build_optimizer",
    "check_lr_schedule",
    "clip_grad_norm_global",
    "lr_at",
    "set_lr",
    "start_clip_grad_norm",
]

CLIP_EPS: Final = 1e-6
"""Added to the total norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does."""

LRSchedule = Literal["constant", "cosine", "warmup-cosine"]
LR_SCHEDULES: Final[tuple[LRSchedule, ...]] = get_args(LRSchedule)


@dataclass(frozen=True)
class OptimizerSettings:
    """Which optimizer a stage runs, and its hyper-parameters.

    Attributes:
        name: ``"sgd"``, ``"sgd-momentum"``, ``"adam"`` (L2 penalty added to the gradient) or
            ``"adamw"`` (decoupled weight decay).
        lr: the base learning rate (a schedule scales it per step, see :func:`lr_at`).
        momentum: SGD's momentum; None: :data:`SGD_MOMENTUM` for ``"sgd-momentum"``, 0 for ``"sgd"``.
            Adam and AdamW take none (their betas are torch's, (0.9, 0.999)).
        weight_decay: None: :data:`ADAMW_WEIGHT_DECAY` for ``"adamw"``, 0 for the others.

    Raises:
        UserError: an unknown name or a value out of range, naming the flag to change.
    """

    name: OptimizerName = "sgd"
    lr: float = 0.01
    momentum: float | None = None
    weight_decay: float | None = None

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZER_NAMES:
            raise UserError(f"--optimizer {self.name!r} is unknown; use one of {', '.join(OPTIMIZER_NAMES)}")
        if not self.lr > 0:
            raise UserError(f"--lr {self.lr}: the learning rate must be > 0")
        if self.weight_decay is not None and not self.weight_decay >= 0:
            raise UserError(f"--weight-decay {self.weight_decay}: give a value >= 0")
        if self.momentum is None:
            return
        if self.name in ("adam", "adamw") and self.momentum != 0:
            raise UserError(f"--momentum applies to sgd and sgd-momentum, not {self.name}; leave it out")
        if self.name == "sgd-momentum" and not self.momentum > 0:
            raise UserError(f"--momentum {self.momentum}: sgd-momentum needs momentum > 0 (or use --optimizer sgd)")
        if not self.momentum >= 0:
            raise UserError(f"--momentum {self.momentum}: give a value >= 0")

    @property
    def resolved_momentum(self) -> float:
        """The momentum SGD runs with (0 for Adam and AdamW)."""
        if self.momentum is not None:
            return self.momentum
        return SGD_MOMENTUM if self.name == "sgd-momentum" else 0.0

    @property
    def resolved_weight_decay(self) -> float:
        """The weight decay the optimizer runs with."""
        if self.weight_decay is not None:
            return self.weight_decay
        return ADAMW_WEIGHT_DECAY if self.name == "adamw" else 0.0

    @property
    def state_name(self) -> OptimizerName:
        """The optimizer as the memory model counts its state (:data:`~pipetrain.plan.memory.OPTIMIZER_STATE_COPIES`):
        ``"sgd"`` with momentum keeps a buffer, like ``"sgd-momentum"``."""
        return "sgd-momentum" if self.name == "sgd" and self.resolved_momentum > 0 else self.name


def build_optimizer(settings: OptimizerSettings, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer ``settings`` names, over ``params`` (one stage's parameters).

    ``sgd`` / ``sgd-momentum``: ``torch.optim.SGD``; ``adam``: ``torch.optim.Adam`` (weight decay as an
    L2 term in the gradient); ``adamw``: ``torch.optim.AdamW`` (decoupled weight decay): the optimizers
    the profiler times (:func:`~pipetrain.profile.optimizer_step.torch_optimizer`).
    """
    return torch_optimizer(settings.name, params, lr=settings.lr, momentum=settings.resolved_momentum,
                           weight_decay=settings.resolved_weight_decay)


def check_lr_schedule(schedule: str, warmup_steps: int, total_steps: int) -> LRSchedule:
    """``schedule`` as an :data:`LRSchedule`, checked against the warm-up and the run's length.

    Raises:
        UserError: an unknown schedule, or a warm-up that the schedule does not take or that leaves
            no step to decay over; the message names ``--lr-schedule`` / ``--warmup-steps``.
    """
    if schedule not in LR_SCHEDULES:
        raise UserError(f"--lr-schedule {schedule!r} is unknown; use one of {', '.join(LR_SCHEDULES)}")
    if warmup_steps < 0:
        raise UserError(f"--warmup-steps {warmup_steps}: give a step count >= 0")
    if schedule != "warmup-cosine" and warmup_steps > 0:
        raise UserError(f"--warmup-steps applies to --lr-schedule warmup-cosine only, not {schedule!r}; "
                        "use --lr-schedule warmup-cosine or leave --warmup-steps out")
    if schedule == "warmup-cosine" and not 0 < warmup_steps < total_steps:
        raise UserError(f"--lr-schedule warmup-cosine needs 1 <= --warmup-steps < the {total_steps} steps of "
                        f"the run (got {warmup_steps})")
    return schedule  # type: ignore[return-value]  # checked against LR_SCHEDULES above


def lr_at(step: int, total_steps: int, base_lr: float, schedule: str, warmup_steps: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total_steps``.

    With ``b = base_lr``, ``T = total_steps``, ``W = warmup_steps``:

    - ``constant``: ``b``.
    - ``cosine``: ``b · ½(1 + cos(π · step / T))``: ``b`` at step 0, decaying towards 0 at ``T``.
    - ``warmup-cosine``: ``b · (step + 1) / W`` for ``step < W`` (linear warm-up reaching ``b`` at
      step ``W - 1``), then ``b · ½(1 + cos(π · (step - W) / (T - W)))``.

    Raises:
        UserError: see :func:`check_lr_schedule`.
        ValueError: ``step`` is not in ``[0, T)``.
    """
    checked = check_lr_schedule(schedule, warmup_steps, total_steps)
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} is outside the run's {total_steps} steps")
    if checked == "constant":
        return base_lr
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer`` to ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm_global(
    params: Sequence[torch.Tensor],
    max_norm: float,
    *,
    world: dist.ProcessGroup | None,
    replicas: int = 1,
    device: torch.device | None = None,
    copies: Mapping[int, int] | None = None,
) -> float:
    """Clip the gradient norm of the whole model, whose parameters are spread over pipeline stages.

    The total norm is the L2 norm of every stage's gradients seen as one vector, and every gradient
    is scaled by the same factor, exactly as ``torch.nn.utils.clip_grad_norm_`` does over all of the
    model's parameters in one process::

        total = sqrt(Σ_ranks Σ_{p on rank} ‖p.grad‖² / copies(p))
        p.grad ← p.grad · min(1, max_norm / (total + 1e-6))

    A stage replicated on ``r`` ranks (same, already all-reduced gradients) counts once: each replica
    adds ``1/r`` of its squared norm (``copies(p) = replicas``). A tied parameter held by several
    stages (same, summed gradients, :mod:`pipetrain.runtime.interp.ties`) counts once too: each copy
    adds ``1/copies`` of it. The squares are summed in float64 with one all-reduce over
    ``world``, which every rank of ``world`` must join once per step (``params=[]`` if it has none).

    Args:
        params: this rank's parameters; those without a gradient are skipped.
        max_norm: the largest total norm allowed (> 0).
        world: the process group of every rank of the plan (``dist.group.WORLD``), or None when one
            process holds the whole model (nothing is reduced).
        replicas: how many ranks hold this rank's stage (1 when it is not replicated).
        device: where the squares are reduced (default: the first gradient's, else the CPU).
        copies: for tied parameters, by ``id``, how many copies the plan's ranks hold.

    Returns the total norm before clipping (the same on every rank).

    Raises UserError for ``max_norm <= 0``, ValueError for ``replicas < 1``.
    """
    return start_clip_grad_norm(params, max_norm, world=world, replicas=replicas, device=device,
                                copies=copies).finish()


def start_clip_grad_norm(
    params: Sequence[torch.Tensor],
    max_norm: float,
    *,
    world: dist.ProcessGroup | None,
    replicas: int = 1,
    device: torch.device | None = None,
    copies: Mapping[int, int] | None = None,
    async_op: bool = False,
) -> ClipNorm:
    """:func:`clip_grad_norm_global` in two halves: sum this rank's squares and start their
    all-reduce over ``world`` (without blocking when ``async_op``); :meth:`ClipNorm.finish` waits for
    it and scales the gradients. Until then the gradients must stay as they are.

    2BW clips a batch's gradient by its global norm although its stages step at different moments
    (docs/algorithms.md §3.5): a stage starts the all-reduce at its STEP and finishes it when something
    needs the step, so no rank waits for a stage that steps later. ``world`` is then a process group
    of its own, whose only collectives are these all-reduces, in the same order on every rank.

    Raises UserError for ``max_norm <= 0``, ValueError for ``replicas < 1``.
    """
    if not max_norm > 0:
        raise UserError(f"--clip-grad-norm {max_norm}: give a norm > 0, or leave it out to not clip")
    if replicas < 1:
        raise ValueError(f"replicas={replicas}: a stage runs on at least 1 rank")
    tied = copies or {}
    grads = [p.grad for p in params if p.grad is not None]
    where = device if device is not None else (grads[0].device if grads else torch.device("cpu"))
    squared = torch.zeros((), dtype=torch.float64, device=where)
    shared = torch.zeros((), dtype=torch.float64, device=where)
    for p in params:
        if p.grad is not None:
            norm = torch.linalg.vector_norm(p.grad, 2.0).to(where, torch.float64).square()
            if id(p) in tied:
                shared += norm / tied[id(p)]
            else:
                squared += norm
    squared = squared / replicas + shared
    work = None
    if world is not None:
        work = dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=world, async_op=async_op)
    return ClipNorm(grads, squared, max_norm, work)


class ClipNorm:
    """A clipping under way (:func:`start_clip_grad_norm`): the squared norm being summed over the
    ranks, and the gradients it will scale.

    Args:
        grads: the gradients to scale.
        squared: the squared total norm, a float64 scalar (being all-reduced while ``work`` runs).
        max_norm: the largest total norm allowed.
        work: the all-reduce still running, or None (done, or nothing to reduce).
    """

    def __init__(self, grads: list[torch.Tensor], squared: torch.Tensor, max_norm: float,
                 work: dist.Work | None) -> None:
        self.grads, self.squared, self.max_norm, self.work = grads, squared, max_norm, work

    @property
    def in_flight(self) -> bool:
        """Whether the all-reduce was started without blocking and not waited for yet."""
        return self.work is not None

    def finish(self) -> float:
        """Wait for the norm, scale the gradients by ``min(1, max_norm / (total + 1e-6))``; returns
        the total norm before clipping."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        total = self.squared.sqrt().to(torch.float32)
        scale = torch.clamp(self.max_norm / (total + CLIP_EPS), max=1.0)
        for g in self.grads:
            g.mul_(scale.to(g.device, g.dtype))
        return float(total)
