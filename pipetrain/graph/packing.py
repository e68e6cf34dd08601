"""Several batched tensors as one, and back: what crosses a cut, and a model's keyword inputs.

A stage boundary carries one tensor per port (the runtime's messages are one tensor each), and the
model input is one tensor. When several values must travel at once (a Hugging Face block's hidden
states *and* its attention mask; ``input_ids`` *and* ``attention_mask``), they are packed into one
``[b, n]`` tensor of a *carrier* dtype, side by side, per sample::

    hidden [b, 16, 32] float32 + mask [b, 1, 16, 16] bool   ->   [b, 512 + 64] float32
    input_ids [b, 16] int64 + attention_mask [b, 16] int64   ->   [b, 32] int64

The carrier is the first floating-point dtype among the values (else the first dtype). A value of
the carrier dtype is flattened as is, so gradients flow through it; any other value travels as its
bytes, bit for bit, padded to whole carrier elements (``mask``: 256 bytes = 64 float32), and gets no
gradient (masks, ids and positions have none). :func:`unpack` reverses :func:`pack` given each
value's per-sample :class:`Slot`.

    >>> layout = (Slot((2,), torch.float32), Slot((3,), torch.bool))
    >>> packed = pack([torch.ones(4, 2), torch.zeros(4, 3, dtype=torch.bool)])
    >>> packed.shape, packed.dtype
    (torch.Size([4, 3]), torch.float32)
    >>> [tuple(t.shape) for t in unpack(packed, layout)]
    [(4, 2), (4, 3)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["Slot", "carrier", "pack", "slot_width", "unpack"]


class Slot(NamedTuple):
    """One packed value's per-sample shape and dtype: the value is ``[b, *shape]``."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def carrier(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    """The dtype a pack of values of ``dtypes`` travels in: the first floating-point one, else the first."""
    return next((d for d in dtypes if d.is_floating_point), dtypes[0])


def slot_width(slot: Slot, carried: torch.dtype) -> int:
    """Carrier elements per sample that ``slot`` takes in a pack of dtype ``carried``."""
    n = math.prod(slot.shape)
    if slot.dtype == carried:
        return n
    size = _itemsize(carried)
    return -(-n * _itemsize(slot.dtype) // size)


def pack(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[b, Σ widths]`` of the carrier dtype: each ``[b, *shape]`` value flattened (its bytes, for
    a value of another dtype) and laid side by side, in order."""
    carried = carrier([v.dtype for v in values])
    b = values[0].shape[0]
    columns = []
    for value in values:
        flat = value.reshape(b, -1)
        if value.dtype != carried:
            raw = flat.detach().contiguous().view(torch.uint8)
            pad = (-raw.shape[1]) % _itemsize(carried)
            raw = torch.nn.functional.pad(raw, (0, pad)) if pad else raw
            flat = raw.view(carried)
        columns.append(flat)
    return torch.cat(columns, dim=1)


def unpack(packed: torch.Tensor, slots: Sequence[Slot], carried: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The values of ``packed`` (``[b, Σ widths]``), one ``[b, *slot.shape]`` of ``slot.dtype`` per slot.

    ``carried``: ``packed``'s dtype, when known (then nothing but the batch size is read from
    ``packed``, so ``torch.fx`` can trace this)."""
    b, carried = packed.shape[0], packed.dtype if carried is None else carried
    values, lo = [], 0
    for slot in slots:
        hi = lo + slot_width(slot, carried)
        chunk = packed[:, lo:hi]
        if slot.dtype != carried:
            raw = chunk.detach().contiguous().view(torch.uint8)[:, :math.prod(slot.shape) * _itemsize(slot.dtype)]
            chunk = raw.contiguous().view(slot.dtype)
        values.append(chunk.reshape(b, *slot.shape))
        lo = hi
    return tuple(values)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
