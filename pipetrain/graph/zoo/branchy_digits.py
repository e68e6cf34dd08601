"""``branchy-digits``: a two-branch classifier of scikit-learn's 8×8 digits (a DAG).

The smallest branchy model that learns something: both branches read the whole input ``[64]`` (the
standardised pixels, :mod:`pipetrain.data.digits`), one as a feature vector, one as a ``1×8×8``
image, and their features are concatenated for a linear classifier. With ``L`` layers per branch,
``W`` the width and ``C`` the channels::

    mlp0          ReLU(Linear(64 → W))                                 [b, 64] → [b, W]
    mlp{j}        ReLU(Linear(W → W)), j = 1 … L−1                              → [b, W]
    img0          view as [b, 1, 8, 8], ReLU(Conv 3×3, 1 → C, pad 1)            → [b, C, 8, 8]
    img{j}        ReLU(Conv 3×3, C → C, pad 1), j = 1 … L−2                     → [b, C, 8, 8]
    img{L−1}      flatten, ReLU(Linear(64·C → W))                               → [b, W]
    concat        mlp{L−1}, img{L−1}                                            → [b, 2W]
    head          Linear(2W → 10)                                               → [b, 10] logits

``2L + 2`` layers (8 by default), ordered ``mlp0 … mlp{L−1}, img0 … img{L−1}, concat, head``; the
branches cost differently (the conv branch more per sample), which is what a DAG partitioner
should balance. Targets are the digit, int64 in ``[0, 10)`` (``LossKind.CROSS_ENTROPY``); its
input and target fit the built-in ``digits`` data, which is its default data as for ``mlp-digits``.
Three epochs of Adam (lr 1e-3, batches of 64) reach about 0.98 eval accuracy (tests/unit/test_zoo_branchy.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo.branches import FF, Concat, DagBuilder

__all__ = ["BranchyDigitsConfig", "ConvLayer", "FlatFF", "build"]

SIDE = 8  # the digits are 8×8
CLASSES = 10


@dataclass(frozen=True)
class BranchyDigitsConfig:
    """Sizes of ``branchy-digits``.

    Attributes:
        layers: layers per branch, L.
        width: features of each branch's output and of the MLP branch, W.
        channels: channels of the conv branch, C.
    """

    layers: int = 3
    width: int = 128
    channels: int = 16


class ConvLayer(nn.Module):
    """``ReLU(Conv 3×3, pad 1)``: ``[b, c_in, 8, 8]`` → ``[b, c_out, 8, 8]``; a flat input ``[b, 64]``
    (``c_in = 1``) is first viewed as the ``[b, 1, 8, 8]`` image."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.c_in = c_in
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        nn.init.kaiming_normal_(self.conv.weight, nonlinearity="relu")
        if self.conv.bias is not None:
            nn.init.zeros_(self.conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        image = x.view(x.shape[0], self.c_in, SIDE, SIDE)
        return torch.relu(self.conv(image))


class FlatFF(FF):
    """``ReLU(Linear(flatten(x)))``: ``[b, c, 8, 8]`` (or ``[b, 64]``) → ``[b, d_out]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(1))


def build(config: BranchyDigitsConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``mlp0 …``, ``img0 …``, ``concat``, ``head``."""
    c, n_in = config, SIDE * SIDE
    dag = DagBuilder()
    mlp = [functools.partial(FF, n_in if j == 0 else c.width, c.width) for j in range(c.layers)]
    mlp_end = dag.chain("mlp", mlp)
    convs = [functools.partial(ConvLayer, 1 if j == 0 else c.channels, c.channels) for j in range(c.layers - 1)]
    flat_in = n_in * (c.channels if c.layers > 1 else 1)
    img_end = dag.chain("img", [*convs, functools.partial(FlatFF, flat_in, c.width)])
    merged = dag.add("concat", Concat, (mlp_end, img_end))
    dag.add("head", functools.partial(FF, 2 * c.width, CLASSES, False), (merged,))
    return dag.graph(
        name,
        input=TensorSpec((n_in,)),
        target=TensorSpec((), "int64", high=CLASSES),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
