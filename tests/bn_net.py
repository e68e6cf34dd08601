"""A tiny BatchNorm CNN for the digits (issue 26 §4): conv + BatchNorm + ReLU blocks, then a head whose
BatchNorm1d sees one value per channel of a sample, so it cannot train on micro-batches of 1.

    stem      view [b, 64] as [b, 1, 8, 8]; Conv3×3(1→4), BN, ReLU        [b, 4, 8, 8]
    blocks.0  Conv3×3(4→8, stride 2), BN, ReLU                           [b, 8, 4, 4]
    blocks.1  Conv3×3(8→8, stride 2), BN, ReLU                           [b, 8, 2, 2]
    head      mean over the map, Linear(8→8), BatchNorm1d, ReLU, Linear   [b, 10]

The blocks are Sequentials of their own (``blocks.0.1`` is a BatchNorm2d), so their state names
have the depth of torchvision's ``layer1.0.bn1``.
"""

from __future__ import annotations

import torch
from torch import nn

from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec


def conv_bn_relu(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class Head(nn.Module):
    """``[b, C, H, W]`` → ``[b, classes]``; its BatchNorm1d sees ``[b, C]``."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, channels)
        self.bn = nn.BatchNorm1d(channels)
        self.out = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.bn(self.fc(x.mean(dim=(2, 3))))))


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn_relu(1, 4, 1)
        self.blocks = nn.Sequential(conv_bn_relu(4, 8, 2), conv_bn_relu(8, 8, 2))
        self.head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x.view(-1, 1, 8, 8))))


def build() -> BNNet:
    """The model, seeded (``--model tests.bn_net:build``)."""
    torch.manual_seed(0)
    return BNNet()


def graph() -> LayerGraph:
    """:func:`build` captured for the digits (inputs ``[b, 64]``, ten classes)."""
    return capture(build(), input=TensorSpec((64,)), target=TensorSpec((), "int64", high=10),
                   loss=LossKind.CROSS_ENTROPY, name="bn-net")
