"""Small convolutional networks for the 8×8 digits, taken as ``[b, 1, 8, 8]`` images.

Two chains that train in seconds on a CPU and give the local-learning method (PPLL, Guo et al. 2024,
arXiv 2411.12780; docs/algorithms.md §6) convolutional stages to put auxiliary heads on:

``cnn-digits`` (plain, no BatchNorm, so pipelined and unpipelined runs compute the same numbers)::

    conv1  Conv3×3(1→c), ReLU               [b, 1, 8, 8]  -> [b, c, 8, 8]
    conv2  Conv3×3(c→2c), ReLU                            -> [b, 2c, 8, 8]
    conv3  Conv3×3(2c→2c, stride 2), ReLU                 -> [b, 2c, 4, 4]
    conv4  Conv3×3(2c→4c), ReLU                           -> [b, 4c, 4, 4]
    fc     global average pool, Linear(4c → classes)      -> [b, classes]

``resnet-digits`` (basic residual blocks of He et al. 2016, two 3×3 convolutions with BN; a
strided 1×1 projection shortcut where the shape changes)::

    stem    Conv3×3(1→c), BN, ReLU          [b, 1, 8, 8]  -> [b, c, 8, 8]
    block1  basic block c → c                             -> [b, c, 8, 8]
    block2  basic block c → 2c, stride 2                  -> [b, 2c, 4, 4]
    block3  basic block 2c → 2c                           -> [b, 2c, 4, 4]
    fc      global average pool, Linear(2c → classes)     -> [b, classes]

``c`` is the ``channels`` setting (16 in both presets). Convolutions are He-normal over fan-out;
targets are one int64 class per sample, scored with ``LossKind.CROSS_ENTROPY``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["BasicBlock", "ConvReLU", "DigitConvConfig", "PoolClassifier", "build_cnn", "build_resnet"]


@dataclass(frozen=True)
class DigitConvConfig:
    """Sizes of a digits conv net.

    Attributes:
        image: input height and width (8 for the digits).
        channels: ``c``, the first layer's output channels.
        classes: output logits per sample.
    """

    image: int = 8
    channels: int = 16
    classes: int = 10


def _conv(c_in: int, c_out: int, stride: int = 1, bias: bool = True) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=bias)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


class ConvReLU(nn.Sequential):
    """``Conv3×3(c_in → c_out, stride), ReLU``: ``[b, c_in, s, s]`` → ``[b, c_out, s/stride, s/stride]``."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, batch_norm: bool = False) -> None:
        norm: list[nn.Module] = [nn.BatchNorm2d(c_out)] if batch_norm else []
        super().__init__(_conv(c_in, c_out, stride, bias=not batch_norm), *norm, nn.ReLU())


class BasicBlock(nn.Module):
    """``relu(BN(conv(relu(BN(conv(x))))) + shortcut(x))``: ``[b, c_in, s, s]`` → ``[b, c_out, s/stride, s/stride]``."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            _conv(c_in, c_out, stride, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            _conv(c_out, c_out, bias=False), nn.BatchNorm2d(c_out),
        )  # fmt: skip
        projection = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
        same = stride == 1 and c_in == c_out
        self.shortcut = nn.Identity() if same else nn.Sequential(projection, nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class PoolClassifier(nn.Sequential):
    """Global average pool and a linear classifier: ``[b, c, s, s]`` → ``[b, classes]``."""

    def __init__(self, c_in: int, classes: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))


def _graph(name: str, layers: list[Layer], config: DigitConvConfig, seed: int) -> LayerGraph:
    return LayerGraph(
        name=name,
        layers=tuple(layers),
        input=TensorSpec((1, config.image, config.image)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )


def build_cnn(config: DigitConvConfig, name: str, seed: int) -> LayerGraph:
    """``cnn-digits``: layers ``conv1 … conv4, fc``."""
    c = config.channels
    shapes = ((1, c, 1), (c, 2 * c, 1), (2 * c, 2 * c, 2), (2 * c, 4 * c, 1))
    layers = [Layer(f"conv{i + 1}", functools.partial(ConvReLU, *shape)) for i, shape in enumerate(shapes)]
    layers.append(Layer("fc", functools.partial(PoolClassifier, 4 * c, config.classes)))
    return _graph(name, layers, config, seed)


def build_resnet(config: DigitConvConfig, name: str, seed: int) -> LayerGraph:
    """``resnet-digits``: layers ``stem, block1 … block3, fc``."""
    c = config.channels
    layers = [
        Layer("stem", functools.partial(ConvReLU, 1, c, 1, True)),
        Layer("block1", functools.partial(BasicBlock, c, c)),
        Layer("block2", functools.partial(BasicBlock, c, 2 * c, 2)),
        Layer("block3", functools.partial(BasicBlock, 2 * c, 2 * c)),
        Layer("fc", functools.partial(PoolClassifier, 2 * c, config.classes)),
    ]
    return _graph(name, layers, config, seed)
