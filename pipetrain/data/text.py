"""``text``: byte-level language modelling on a corpus that ships with Python itself.

The corpus is the text of the standard library's ``pydoc_data.topics`` (the help topics behind
``help("if")``; about 0.47 MB), its topics joined in name order and encoded as UTF-8, so every token
is a byte in ``[0, 256)``. The first 90% of the bytes are train, the last 10% eval (no shuffling:
the split is a fixed point in the text). Each part is cut into windows of ``context + 1`` bytes,
``context`` apart, so an epoch predicts every byte once. Samples for context ``T``::

    input  [T] int64   bytes i*T     … i*T + T - 1
    target [T] int64   bytes i*T + 1 … i*T + T       (the next byte of every input position)

Inputs and targets are strided views of one byte tensor (no copy per window).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.data import Dataset

from pipetrain.data.pair import DatasetPair, Sample, tensor_pairs
from pipetrain.errors import UserError

__all__ = ["EVAL_FRACTION", "VOCAB", "corpus_bytes", "text_pair"]

VOCAB = 256
EVAL_FRACTION = 0.1


@functools.lru_cache(maxsize=1)
def corpus_bytes() -> torch.Tensor:
    """The whole corpus as ``[n_bytes]`` int64 token ids in ``[0, 256)``."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise UserError(
            "the text data needs the standard library's pydoc_data module, which this Python lacks; "
            "install the full Python standard library or use --data module.path:callable"
        ) from None
    raw = "".join(topics[name] for name in sorted(topics)).encode("utf-8")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)


@functools.lru_cache(maxsize=4)
def text_pair(context: int) -> DatasetPair:
    """Train and eval windows of ``context`` input bytes (materialised once per context)."""
    if context < 1:
        raise UserError(f"the text data needs a context of at least 1 token, not {context}")
    data = corpus_bytes()
    cut = len(data) - int(len(data) * EVAL_FRACTION)
    train, held_out = _windows(data[:cut], context), _windows(data[cut:], context)
    if len(held_out) == 0:  # type: ignore[arg-type]
        raise UserError(f"context {context} is longer than the text data's eval part; use a shorter context")
    return DatasetPair(train, held_out)


def _windows(part: torch.Tensor, context: int) -> Dataset[Sample]:
    """``(inputs [N, T], targets [N, T])`` views of ``part``; ``N = (len - 1) // T`` windows."""
    if len(part) < context + 1:
        empty = torch.empty(0, context, dtype=torch.int64)
        return tensor_pairs(empty, empty)
    inputs = part[:-1].unfold(0, context, context)
    targets = part[1:].unfold(0, context, context)
    return tensor_pairs(inputs, targets)
