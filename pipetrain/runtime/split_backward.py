"""The split backward of method ``zb1``: B (input gradients) and W (weight gradients), per layer.

Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2: B computes the gradient
of the stage input and of every activation inside the stage; W then computes each layer's weight
gradients from the gradient of that layer's output, which B already has.

Data (``b`` samples of the micro-batch): forward runs the stage's layers one by one
(:func:`layer_outputs`) and keeps, per layer, its output ``h_i [b, *out_i]`` and its parameters. B
(:func:`input_grads`) asks autograd for the gradients of ``x [b, *in]`` and of every ``h_i`` in one
pass, keeping the graph. W (:func:`weight_grads`) runs ``backward(h_i, g_i, inputs=params_i)`` per
layer: each traverses only its own layer's part of the graph (autograd prunes what does not lead to
``params_i``) and frees it, so no input gradient is computed twice across layers; inside one layer
(e.g. a transformer block) W re-traverses the layer's own graph to reach its earlier weights.

B keeps the ``g_i`` until W: one gradient per layer output per pending micro-batch, memory the
activation ledger does not count (it counts the saved activations, released at W).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["LayerPart", "WeightWork", "input_grads", "layer_outputs", "weight_grads"]

LayerPart = tuple[torch.Tensor, list[nn.Parameter]]
"""A layer's output ``h_i`` in the stage's forward graph and the parameters it trains."""

WeightWork = list[tuple[torch.Tensor, torch.Tensor, list[nn.Parameter]]]
"""What W does: per layer, ``(h_i, gradient of h_i, parameters)``."""


def layer_outputs(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[LayerPart]]:
    """Run the stage on ``x``, layer by layer when it is a ``nn.Sequential``; its output and the parts."""
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    parts: list[LayerPart] = []
    h = x
    for layer in layers:
        h = layer(h)
        parts.append((h, [p for p in layer.parameters() if p.requires_grad]))
    return h, parts


def input_grads(y: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor,
                parts: Sequence[LayerPart]) -> tuple[torch.Tensor | None, WeightWork]:
    """B: the gradient of ``x`` (None when ``x`` takes none) and the work W needs, from one pass that
    keeps the graph. ``y`` is the stage's output (the last stage: its loss), ``grad`` its gradient."""
    wanted = [h for h, params in parts if h.requires_grad and params]
    targets = ([x] if x.requires_grad else []) + wanted
    if not targets or not y.requires_grad:
        return (torch.zeros_like(x) if x.requires_grad else None), []
    grads = torch.autograd.grad(y, targets, grad, retain_graph=True, allow_unused=True)
    x_grad = (grads[0] if grads[0] is not None else torch.zeros_like(x)) if x.requires_grad else None
    params_of = {id(h): params for h, params in parts}
    work = [(h, g, params_of[id(h)]) for h, g in zip(wanted, grads[len(targets) - len(wanted):], strict=True)
            if g is not None]
    return x_grad, work


def weight_grads(work: WeightWork) -> None:
    """W: each layer's weight gradients, accumulated into ``.grad``; frees each layer's graph."""
    for h, g, params in reversed(work):
        torch.autograd.backward(h, g, inputs=params)
