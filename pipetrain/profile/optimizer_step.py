"""The optimizer step's cost: what each optimizer's step (and gradient clipping) does to a layer's
parameters, measured on a device or estimated from their bytes.

    steps = time_steps(timer, module)     # {"sgd": s, "sgd-momentum": s, "adam": s, "adamw": s}
    clip = time_clip(timer, module)       # the layer's share of clipping the gradient norm
    memory_bound_s(STEP_PASSES["adamw"], parameter_bytes, bandwidth)   # 7 passes / bandwidth
    optimizer = torch_optimizer("adamw", params, lr=3e-4)              # as the runtime builds it

An optimizer step is elementwise over the parameters, so it is memory-bound: per float32 parameter it
reads and writes parameter-sized buffers (:data:`STEP_PASSES`): SGD reads ``p`` and ``g`` and writes
``p`` (3 passes); SGD with momentum also reads and writes its buffer ``m`` (5); Adam and AdamW read
``p, g, m, v`` and write ``p, m, v`` (7; Kingma and Ba 2015, Loshchilov and Hutter 2019). Clipping
the global gradient norm (:func:`pipetrain.runtime.job.optim.clip_grad_norm_global`) reads every
gradient for the norm and reads and writes it to scale it (:data:`CLIP_PASSES`, 3), and all-reduces
one scalar over the plan's ranks (priced by :meth:`pipetrain.cost.CostModel.clip_allreduce_s`).

A measured profile times each optimizer's step over a layer's parameters with the optimizer the
runtime builds (:func:`torch_optimizer`, torch's own defaults: ``foreach`` kernels on a GPU, a loop
over the tensors on a CPU), so per-tensor overheads count as they do in training; an estimated one
prices ``passes × parameter bytes / memory bandwidth`` (:func:`memory_bound_s`). A profile written
before the other optimizers were timed holds SGD's step alone; the others are then SGD's scaled by
their passes (:func:`scaled_from_sgd`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final, Literal, get_args

import torch
from torch import nn

from pipetrain.profile.timing import _Timer

__all__ = [
    "ADAMW_WEIGHT_DECAY",
    "CLIP_PASSES",
    "OPTIMIZER_NAMES",
    "SGD_MOMENTUM",
    "STEP_PASSES",
    "OptimizerName",
    "memory_bound_s",
    "scaled_from_sgd",
    "time_clip",
    "time_steps",
    "torch_optimizer",
]

OptimizerName = Literal["sgd", "sgd-momentum", "adam", "adamw"]

OPTIMIZER_NAMES: Final[tuple[OptimizerName, ...]] = get_args(OptimizerName)

STEP_PASSES: Final[dict[OptimizerName, int]] = {"sgd": 3, "sgd-momentum": 5, "adam": 7, "adamw": 7}
"""Parameter-sized memory passes (reads and writes) of each optimizer's step (module docstring)."""

CLIP_PASSES: Final = 3
"""Gradient-sized memory passes of clipping: one read for the norm, a read and a write to scale."""

SGD_MOMENTUM: Final = 0.9
"""``"sgd-momentum"``'s momentum when none is given."""

ADAMW_WEIGHT_DECAY: Final = 0.01
"""``"adamw"``'s weight decay when none is given (``torch.optim.AdamW``'s own default)."""


def torch_optimizer(name: OptimizerName, params: Iterable[nn.Parameter], *, lr: float,
                    momentum: float | None = None, weight_decay: float | None = None) -> torch.optim.Optimizer:
    """The torch optimizer ``name`` over ``params``, as the runtime trains with it and the profiler times it.

    ``sgd`` / ``sgd-momentum``: ``torch.optim.SGD`` (momentum None: :data:`SGD_MOMENTUM` for
    ``sgd-momentum``, 0 for ``sgd``); ``adam``: ``torch.optim.Adam`` (weight decay as an L2 term in the
    gradient); ``adamw``: ``torch.optim.AdamW`` (decoupled weight decay; None: :data:`ADAMW_WEIGHT_DECAY`).
    Weight decay None is 0 for the others.
    """
    decay = weight_decay if weight_decay is not None else ADAMW_WEIGHT_DECAY if name == "adamw" else 0.0
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay)
    if momentum is None:
        momentum = SGD_MOMENTUM if name == "sgd-momentum" else 0.0
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=decay)


def time_steps(timer: _Timer, module: nn.Module) -> dict[OptimizerName, float]:
    """Seconds of each optimizer's step over ``module``'s parameters (0 without parameters).

    Called after the layer's backward was timed, so every parameter has a gradient; the steps (at a
    learning rate of 1e-6) change weights that are no longer needed. The warm-up runs also create
    the optimizer's state, as a training run's first step does.
    """
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return dict.fromkeys(OPTIMIZER_NAMES, 0.0)
    return {name: _time_step(timer, name, params) for name in OPTIMIZER_NAMES}


def _time_step(timer: _Timer, name: OptimizerName, params: list[nn.Parameter]) -> float:
    """Median seconds of optimizer ``name``'s step over ``params`` (its state freed on return)."""
    optimizer = torch_optimizer(name, params, lr=1e-6)
    return timer.median_s(lambda: optimizer.step)


def time_clip(timer: _Timer, module: nn.Module) -> float:
    """Seconds of ``module``'s share of clipping the global gradient norm (0 without parameters): the
    runtime's per-gradient work, a float64 squared norm summed, then every gradient scaled by
    ``min(1, max_norm / norm)`` (here for a ``max_norm`` no norm reaches: the gradients keep their values)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return timer.median_s(lambda: functools.partial(_clip_once, grads)) if grads else 0.0


_NO_CLIP: Final = 1e30
"""The ``max_norm`` the timed clipping uses: no gradient is changed (the scale clamps to 1)."""


def _clip_once(grads: list[torch.Tensor]) -> None:
    """What :func:`pipetrain.runtime.job.optim.start_clip_grad_norm` and its ``finish`` do to one rank's
    gradients (the all-reduce apart), with :data:`_NO_CLIP` as the largest norm allowed."""
    squared = torch.zeros((), dtype=torch.float64, device=grads[0].device)
    for g in grads:
        squared += torch.linalg.vector_norm(g, 2.0).to(torch.float64).square()
    scale = torch.clamp(_NO_CLIP / (squared.sqrt().to(torch.float32) + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale.to(g.device, g.dtype))


def memory_bound_s(passes: float, n_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds of ``passes`` passes over ``n_bytes`` at the device's memory bandwidth."""
    return passes * n_bytes / bandwidth_bytes_per_s


def scaled_from_sgd(sgd_s: float, passes: float) -> float:
    """A step of ``passes`` memory passes, from a measured SGD step's seconds (:data:`STEP_PASSES`)."""
    return sgd_s * passes / STEP_PASSES["sgd"]
