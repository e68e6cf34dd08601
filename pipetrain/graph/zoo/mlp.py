"""Multi-layer perceptrons: the simplest chain, every layer the same shape.

Each pipeline layer is one block ``Linear(d_in → hidden), ReLU, Linear(hidden → d_out), ReLU``.
With the ``mlp`` preset that is 1024 → 4096 → 1024 per layer, eight times, so every layer costs
the same (8.4 M multiply-adds, 16.8 MFLOP, per sample): a uniform chain on which equal partitions are
optimal, a baseline for the planners.

Shapes for a micro-batch of ``b`` samples: input ``[b, inputs]`` float32, every inner layer
``[b, width]``, the last layer's output ``[b, classes]`` logits. The last block has no final ReLU
(logits must be able to go negative); the target is one int64 class per sample in
``[0, classes)``, scored with ``LossKind.CROSS_ENTROPY``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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
    """``Linear(d_in → hidden), ReLU, Linear(hidden → d_out)`` and, unless last, a ReLU.

    Maps ``[b, d_in]`` to ``[b, d_out]``.
    """

    def __init__(self, d_in: int, hidden: int, d_out: int, last: bool) -> None:
        tail: list[nn.Module] = [] if last else [nn.ReLU()]
        super().__init__(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out), *tail)


def build(config: MLPConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: layers ``block0 … block{n_layers-1}``."""
    layers = []
    for i in range(config.n_layers):
        d_in = config.inputs if i == 0 else config.width
        last = i == config.n_layers - 1
        d_out = config.classes if last else config.width
        factory = functools.partial(MLPBlock, d_in, config.hidden, d_out, last)
        layers.append(Layer(f"block{i}", factory))
    return LayerGraph(
        name=name,
        layers=tuple(layers),
        input=TensorSpec((config.inputs,)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
