"""The whole model's time at each size, and the layer times scaled to it (docs/algorithms.md §3.2).

Layers timed one at a time do not find the caches as a training step, running them in sequence,
leaves them. So the profiler also times one forward and backward (with the loss) of the whole model
at every size ``b`` of the grid and scales that size's layer times by the ratio of the two
(:func:`_composition_ratios`, one per size, clamped to ``[0.5, 2]``; :func:`_scaled`). A model
that cannot train on one sample (BatchNorm, :mod:`pipetrain.graph.batch_norm`) is not run there:
the sizes below its smallest take the smallest's ratio.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn

from pipetrain.graph.dataflow import whole_model
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.profile.inputs import LossFn, _scaled_loss, sample_input
from pipetrain.profile.table import LayerProfile
from pipetrain.profile.timing import _Timer

__all__: list[str] = []


def _forward_backward(model: nn.Module, loss: LossFn, x: torch.Tensor, targets: torch.Tensor,
                      batch: int) -> Callable[[], object]:
    """One training pass of the whole model on ``x`` (``[b, ...]``), to be timed."""
    def run() -> None:
        out = _scaled_loss(loss, model(x), targets, batch)
        if out.requires_grad:
            torch.autograd.backward(out)
    return run


def _composition_ratios(graph: LayerGraph, layers: Sequence[LayerProfile], timer: _Timer,
                        loss: LossFn, smallest: int = 1) -> list[float]:
    """Per grid size, the whole model's forward + backward seconds over the sum of its layers'.

    Layers timed one at a time do not run as the same layers in sequence do: their caches hold
    one layer's weights and activations, not the model's (on a 2-core CPU gpt-tiny's layers in
    sequence took ×1.15 their sum, the mlp's ×0.93). Each ratio is clamped to [0.5, 2]. Sizes
    below ``smallest`` (the fewest samples the model trains on) take the first trainable size's.
    """
    model = whole_model(graph).to(timer.device)
    generator = torch.Generator().manual_seed(graph.seed)
    grid = layers[0].sizes
    x = sample_input(graph.input, grid[-1], timer.device, generator)
    targets = sample_input(graph.target, grid[-1], timer.device, generator)

    def prepare(b: int) -> Callable[[], Callable[[], object]]:
        return functools.partial(_forward_backward, model, loss, x[:b], targets[:b], grid[-1])

    timer.grow_heap(prepare(grid[-1]))
    ratios = []
    for i, b in enumerate(grid):
        if b < smallest:
            continue
        parts = sum(lp.forward_s[i] + lp.backward_s[i] for lp in layers)
        ratios.append(min(2.0, max(0.5, timer.median_s(prepare(b)) / parts)) if parts > 0 else 1.0)
    return [ratios[0]] * (len(grid) - len(ratios)) + ratios


def _scaled(layer: LayerProfile, ratios: Sequence[float]) -> LayerProfile:
    """``layer`` with every time at grid size ``i`` multiplied by ``ratios[i]``."""
    def times(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if values is None else tuple(v * r for v, r in zip(values, ratios, strict=True))

    forward, backward = times(layer.forward_s), times(layer.backward_s)
    assert forward is not None and backward is not None
    return replace(layer, forward_s=forward, backward_s=backward, input_grad_s=times(layer.input_grad_s),
                   weight_grad_s=times(layer.weight_grad_s))
