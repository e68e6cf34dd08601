"""Multi-layer perceptrons: the simplest chain, every layer the same shape.

Each pipeline layer is one block: ``x + Linear(ReLU(Linear(x)))`` (``d_in → hidden → d_out``) where
it maps a width to itself, else ``ReLU(Linear(ReLU(Linear(x))))``, and the last block gives logits
without a final ReLU. With the ``mlp`` preset that is 1024 → 4096 → 1024 per layer, eight times, so
every layer costs the same (8.4 M multiply-adds, 16.8 MFLOP, per sample): a uniform chain on which
equal partitions are optimal, a baseline for the planners.

Initialisation (why: with torch's default ``Linear`` init every Linear+ReLU shrinks the activations'
variance about six-fold, so the ``mlp-digits`` preset's eight Linear layers gave near-constant
logits and SGD at lr 0.01 stayed at chance, loss 2.30): the first Linear of a block is He (Kaiming)
normal for ReLU (He et al. 2015); a residual block's second Linear is N(0, 1 / (hidden · n_layers))
so that every block adds about 1/n_layers of its input's variance and the residual stream's
variance grows at most about e-fold over the whole model; a non-residual block's is He normal and the last block's
N(0, 1 / hidden). Biases start at zero. Parameter names and shapes are those of the plain
``Linear, ReLU, Linear`` stack, so fingerprints do not depend on it.

Shapes for a micro-batch of ``b`` samples: input ``[b, inputs]`` float32, every inner layer
``[b, width]``, the last layer's output ``[b, classes]`` logits; the target is one int64 class per
sample in ``[0, classes)``, scored with ``LossKind.CROSS_ENTROPY``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["MLPBlock", "MLPConfig", "build"]


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of an MLP.

    Attributes:
        n_layers: pipeline layers (blocks).
        inputs: features per input sample.
        width: features between blocks.
        hidden: features inside a block.
        classes: output logits per sample.
    """

    n_layers: int = 8
    inputs: int = 1024
    width: int = 1024
    hidden: int = 4096
    classes: int = 1024


class MLPBlock(nn.Sequential):
    """``Linear(d_in → hidden), ReLU, Linear(hidden → d_out)``: ``[b, d_in]`` → ``[b, d_out]``.

    A block that is not last adds its input when ``d_in == d_out`` (residual) and otherwise ends in
    a ReLU; the last block returns logits. ``depth`` (the model's number of blocks) scales a
    residual block's initial output (see the module docstring).
    """

    def __init__(self, d_in: int, hidden: int, d_out: int, last: bool, depth: int = 1) -> None:
        residual = not last and d_in == d_out
        first, second = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)
        nn.init.kaiming_normal_(first.weight, nonlinearity="relu")
        if residual:
            nn.init.normal_(second.weight, std=(1.0 / (hidden * max(depth, 1))) ** 0.5)
        elif last:
            nn.init.normal_(second.weight, std=(1.0 / hidden) ** 0.5)
        else:
            nn.init.kaiming_normal_(second.weight, nonlinearity="relu")
        nn.init.zeros_(first.bias)
        nn.init.zeros_(second.bias)
        tail: list[nn.Module] = [] if last or residual else [nn.ReLU()]
        super().__init__(first, nn.ReLU(), second, *tail)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for module in self:
            out = module(out)
        return x + out if self.residual else out


def build(config: MLPConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: layers ``block0 … block{n_layers-1}``."""
    layers = []
    for i in range(config.n_layers):
        d_in = config.inputs if i == 0 else config.width
        last = i == config.n_layers - 1
        d_out = config.classes if last else config.width
        factory = functools.partial(MLPBlock, d_in, config.hidden, d_out, last, config.n_layers)
        layers.append(Layer(f"block{i}", factory))
    return LayerGraph(
        name=name,
        layers=tuple(layers),
        input=TensorSpec((config.inputs,)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
