"""What the profilers feed a model: the micro-batch sizes, seeded random samples, and the loss.

Both profilers (:mod:`.measure` times layers, :mod:`.estimate` prices them) run every layer at
each size ``b`` of a grid (:func:`size_grid`: by default the powers of two below the batch ``B``,
and ``B``, as docs/algorithms.md §2.6 asks of UMPIPE's profiler) on random inputs ``[b, *shape]``
drawn from the model's :class:`~pipetrain.graph.layer_graph.TensorSpec` (:func:`sample_input`).
The loss is a :data:`LossFn` (the model's own: :func:`model_loss_fn`), run on the last layer's
output as ``loss(output, targets) / B`` (the batch mean the runtime backpropagates); what it saves
for backward is part of the last stage's memory (:func:`loss_saved_bytes`, bytes per sample).

A layer with a BatchNorm that sees one value per channel of a sample cannot train on one sample
(:mod:`pipetrain.graph.batch_norm`): the profilers time it from its smallest trainable size up and
fill the grid's smaller sizes by :func:`filled_below` (:func:`trainable_grid` says so once).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import BatchNorms, listed
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec, loss_sum
from pipetrain.profile.stats import SavedStorages
from pipetrain.profile.table import interpolate

__all__ = ["LossFn", "extrapolated_note", "filled_below", "loss_saved_bytes", "model_loss_fn", "sample_input",
           "size_grid", "trainable_grid"]

log = logging.getLogger(__name__)

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


def filled_below(grid: tuple[int, ...], timed: tuple[float, ...]) -> tuple[float, ...]:
    """Seconds at every size of ``grid``, given those ``timed`` at its last ``len(timed)`` sizes.

    A smaller size ``b`` is extrapolated linearly from the two smallest timed sizes, kept between
    proportional time (``t₀ · b / b₀``, no fixed cost) and the smallest timed size's own (``t₀``:
    fewer samples never take longer), so a noisy slope neither predicts 0 s nor more than ``t₀``.
    """
    sizes = grid[len(grid) - len(timed):]
    b0, t0 = sizes[0], timed[0]
    below = tuple(min(t0, max(t0 * b / b0, interpolate(sizes, timed, b))) for b in grid[:len(grid) - len(timed)])
    return below + tuple(timed)


def trainable_grid(model: str, norms: BatchNorms, grid: tuple[int, ...]) -> tuple[int, ...]:
    """``grid``, checked to reach a size every layer trains on; says once (a log line) that the sizes
    below are extrapolated for the layers whose BatchNorm cannot train on them.

    Raises:
        UserError: no size of the grid is large enough (a batch of 1 through such a BatchNorm).
    """
    smallest = norms.smallest_microbatch
    if grid[-1] < smallest:
        raise UserError(f"model {model!r}: BatchNorm in {listed(norms.single_value)} cannot train on {grid[-1]} "
                        f"sample (one value per channel); use a batch (and profile sizes) of at least {smallest}")
    if grid[0] < smallest:
        log.warning("BatchNorm in %s cannot train on 1 sample (one value per channel): profiled from %d samples, "
                    "size 1 extrapolated", listed(norms.single_value), smallest)
    return grid


def extrapolated_note(norms: BatchNorms, grid: tuple[int, ...]) -> str:
    """What a profile's ``source`` adds when some layers' smallest sizes were extrapolated, else ''."""
    if grid[0] >= norms.smallest_microbatch:
        return ""
    return f"; size 1 extrapolated for {len(norms.single_value)} BatchNorm layer(s)"


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
