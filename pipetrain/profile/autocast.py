"""Mixed precision while profiling: the autocast region a layer is measured in, and what it changes
in the byte counts.

    with autocast_region(torch.device("cpu"), "bf16"):       # fp32: no autocast
        out = module(x)                                     # x [b, ...]
    message_bytes(out)     # a floating out [b, ...] at 2 bytes per element under bf16/fp16 autocast

A mixed-precision profile (``bf16``, ``fp16``; :mod:`pipetrain.profile.precision`) times each layer
under ``torch.autocast(device_type, dtype=compute_dtype(precision))``, as the runtime runs a stage's
forward: matmuls and convolutions in the compute dtype, reductions and norms in float32 (PyTorch,
"Automatic Mixed Precision package - torch.amp", op lists for CUDA and CPU). Two counts follow it:

* a layer's output is a message to the next stage, which the runtime sends in the compute dtype
  whatever dtype autocast left it in (a LayerNorm's or a residual add's float32 output included):
  :func:`message_bytes`;
* autocast casts a parameter to the compute dtype in every forward and autograd saves that cast
  (``W^T`` of a Linear, for its input gradient) until the backward. Its bytes do not grow with the
  micro-batch: :func:`is_parameter_cast` tells them apart from the per-sample saved bytes, and the
  profile records them per layer (``LayerProfile.cast_weight_bytes``), which the memory model
  charges once per micro-batch in flight (:mod:`pipetrain.simulate.memory`).

The region runs without autocast's weight cache (``cache_enabled=False``): the runtime enters
autocast for each F on its own, so every micro-batch's forward casts the weights afresh; one long
region with the cache would cast them once, and time the casts in no timed run but the first.

float16 autocast on a CPU covers fewer ops than on CUDA (PyTorch 2.x); a layer whose kernels have no
CPU float16 version fails under it, and :func:`unsupported` turns that failure into a UserError that
says to profile at ``bf16`` on the CPU or at ``fp16`` on a CUDA device.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from pipetrain.errors import UserError
from pipetrain.profile.precision import Precision, compute_dtype

__all__ = ["autocast_region", "is_parameter_cast", "message_bytes", "unsupported"]

_AUTOCAST_DEVICES = ("cpu", "cuda")
"""Device types with an autocast (the meta device has none: estimates trace in the compute dtype)."""

_CASTS_AND_VIEWS = frozenset({"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
                              "PermuteBackward0", "ExpandBackward0", "UnsqueezeBackward0"})
"""Autograd nodes between a saved tensor and the parameter it was cast from (``W.to(bf16).t()``)."""


def autocast_region(device: torch.device, precision: Precision) -> AbstractContextManager[object]:
    """``torch.autocast`` on ``device`` in ``precision``'s compute dtype; no autocast at ``fp32``.

    Raises:
        UserError: a mixed precision on a device type without autocast (the meta device).
    """
    if precision == "fp32":
        return nullcontext()
    if device.type not in _AUTOCAST_DEVICES:
        raise UserError(f"{precision} is measured under torch.autocast, which {device.type!r} has not; measure on "
                        f"{' or '.join(_AUTOCAST_DEVICES)}, or estimate the profile for a device model (--estimate)")
    return torch.autocast(device.type, dtype=compute_dtype(precision), cache_enabled=False)


def message_bytes(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor`` sent to another stage: a floating tensor at the autocast dtype's size while
    autocast is on for its device (module docstring), any other at its own."""
    itemsize = tensor.element_size()
    kind = tensor.device.type
    if tensor.is_floating_point() and kind in _AUTOCAST_DEVICES and torch.is_autocast_enabled(kind):
        itemsize = torch.get_autocast_dtype(kind).itemsize
    return tensor.numel() * itemsize


def is_parameter_cast(tensor: torch.Tensor, parameters: frozenset[int]) -> bool:
    """True when ``tensor`` is a cast of one of ``parameters`` (their ``id``), or a view of one: its
    autograd history leads, through casts and views only, to the parameter's gradient accumulator."""
    node = tensor.grad_fn
    cast = False
    for _ in range(len(_CASTS_AND_VIEWS)):
        if node is None:
            return False
        variable = getattr(node, "variable", None)
        if variable is not None:
            return cast and id(variable) in parameters
        name = type(node).__name__
        if name not in _CASTS_AND_VIEWS or not node.next_functions:
            return False
        cast = cast or name == "ToCopyBackward0"
        node = node.next_functions[0][0]
    return False


def unsupported(model: str, precision: Precision, device: torch.device, error: Exception) -> UserError:
    """The UserError for ``model`` failing under ``precision``'s autocast on ``device`` (module docstring)."""
    hint = ("profile at bf16 on the CPU (`--precision bf16`), or at fp16 on a CUDA device"
            if precision == "fp16" and device.type == "cpu" else "profile it at fp32")
    return UserError(f"{model!r} cannot run under {precision} autocast on {device.type} ({error}); {hint}")
