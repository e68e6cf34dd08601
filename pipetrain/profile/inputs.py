"""What the profilers feed a model: the micro-batch sizes, seeded random samples, and the loss.

Both profilers (:mod:`.measure` times layers, :mod:`.estimate` prices them) run every layer at
each size ``b`` of a grid (:func:`size_grid`: by default the powers of two below the batch ``B``,
and ``B``, as docs/algorithms.md §2.6 asks of UMPIPE's profiler) on random inputs ``[b, *shape]``
drawn from the model's :class:`~pipetrain.graph.layer_graph.TensorSpec` (:func:`sample_input`).
The loss is a :data:`LossFn` (the model's own: :func:`model_loss_fn`), run on the last layer's
output as ``loss(output, targets) / B`` (the batch mean the runtime backpropagates); what it saves
for backward is part of the last stage's memory (:func:`loss_saved_bytes`, bytes per sample).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec, loss_sum
from pipetrain.profile.stats import SavedStorages

__all__ = ["LossFn", "loss_saved_bytes", "model_loss_fn", "sample_input", "size_grid"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(output [b, ...], target [b, ...])``: the sum over the ``b`` samples of each one's loss."""


def size_grid(batch_size: int, sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The micro-batch sizes to profile, increasing.

    Args:
        batch_size: the mini-batch size B.
        sizes: explicit sizes; ``None`` means the powers of two below B, and B itself.

    Raises:
        UserError: B or a size is not a positive integer.
    """
    if batch_size < 1:
        raise UserError(f"batch_size must be at least 1, got {batch_size}")
    if sizes is None:
        powers = (1 << k for k in range(batch_size.bit_length()) if 1 << k < batch_size)
        return (*powers, batch_size)
    if not sizes or min(sizes) < 1:
        raise UserError(f"profile sizes must be positive integers, got {list(sizes)}")
    return tuple(sorted(set(sizes)))


def sample_input(
    spec: TensorSpec, b: int, device: torch.device, generator: torch.Generator
) -> torch.Tensor:
    """A random ``[b, *spec.shape]`` tensor: N(0, 1) floats, or integers uniform in ``[0, high)``."""
    shape = (b, *spec.shape)
    if spec.torch_dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(spec.torch_dtype)
    elif spec.high is None:
        raise UserError(f"integer input {spec} has no `high`; give TensorSpec(..., high=N)")
    else:
        x = torch.randint(0, spec.high, shape, generator=generator, dtype=spec.torch_dtype)
    return x.to(device)


def loss_saved_bytes(graph: LayerGraph, out: torch.Tensor, last_saves_output: bool, generator: torch.Generator,
                     loss: LossFn | None = None) -> int:
    """Bytes per sample the loss saves for backward on the last layer's output ``out`` (``[b, …]``),
    with its targets: what it adds to the last stage's saved bytes. ``out`` itself counts only when
    the last layer does not save it already (``last_saves_output``). Works on the meta device.
    ``loss``: the training loss (default: the model's own, ``graph.loss``)."""
    b = out.shape[0]
    y = out.detach().requires_grad_(out.is_floating_point())
    targets = sample_input(graph.target, b, out.device, generator)
    saved = SavedStorages(nn.Module())
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        _scaled_loss(loss or model_loss_fn(graph), y, targets, b)
    return (saved.total_bytes - (saved.bytes_of(y) if last_saves_output else 0)) // b


def model_loss_fn(graph: LayerGraph) -> LossFn:
    """The model's own loss (``graph.loss``) as a :data:`LossFn`."""
    return functools.partial(loss_sum, graph.loss)


def _scaled_loss(loss: LossFn, y: torch.Tensor, targets: torch.Tensor, batch: int) -> torch.Tensor:
    return loss(y, targets) / batch
