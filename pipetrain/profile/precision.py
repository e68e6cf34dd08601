"""The numeric precision a model trains and is profiled at.

``fp32`` trains in float32 throughout. ``bf16`` and ``fp16`` are mixed precision: each stage's
forward and backward run under ``torch.autocast`` in the *compute dtype* (bfloat16, float16), the
weights and optimizer state stay float32 (the master copy), and the activations and gradients that
travel between stages are in the compute dtype, half the bytes of float32. ``fp16`` needs a loss
scaler (its range is narrow); ``bf16`` does not.

The precision lives here, at the bottom of the layers, because the profile (costs at a precision),
the plan (which precision it runs), the memory model, the simulator and the runtime all read it.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from pipetrain.errors import UserError

__all__ = ["PRECISIONS", "Precision", "compute_dtype", "message_bytes_factor", "parse_precision"]

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

_DTYPES: dict[Precision, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_precision(value: str) -> Precision:
    """``value`` as a :data:`Precision`, or a :class:`UserError` naming the choices."""
    for p in PRECISIONS:
        if value == p:
            return p
    raise UserError(f"precision {value!r} is unknown; use one of {', '.join(PRECISIONS)}")


def compute_dtype(precision: Precision) -> torch.dtype:
    """The dtype a stage computes in and sends activations and gradients in: float32, bfloat16 or float16."""
    return _DTYPES[precision]


def message_bytes_factor(precision: Precision) -> float:
    """Bytes of a floating-point message at ``precision`` over its float32 bytes: 1.0 or 0.5."""
    return compute_dtype(precision).itemsize / 4
