"""ResNet-50: a stem, 16 bottleneck blocks and a classifier head, one pipeline layer each.

After He, Zhang, Ren and Sun, "Deep Residual Learning for Image Recognition" (CVPR 2016), Table 1,
the 50-layer column, one of the image models of the PipeDream and BaPipe benchmarks (docs/algorithms.md §3,
§4). The residual connections stay inside their block, so the graph is a chain of 18 layers, with
``w`` the width multiplier and ``r`` the stem's stride::

    conv1      [b, 3, S, S]          -> [b, 64w, S/r, S/r]       stem (see below)
    conv2_1…3                        -> [b, 256w, S/r, S/r]      bottleneck 64w → 64w → 256w
    conv3_1…4                        -> [b, 512w, S/2r, S/2r]    bottleneck 128w → 128w → 512w
    conv4_1…6                        -> [b, 1024w, S/4r, S/4r]   bottleneck 256w → 256w → 1024w
    conv5_1…3                        -> [b, 2048w, S/8r, S/8r]   bottleneck 512w → 512w → 2048w
    fc         global average pool, Linear(2048w → classes) -> [b, classes] logits

A bottleneck block is ``relu(BN(conv1×1(relu(BN(conv3×3(relu(BN(conv1×1(x))))))) + shortcut(x))``;
the shortcut is the identity, or a strided 1×1 convolution with BN (projection shortcut, option B
of the paper) where the shape changes: in the first block of each stage. The first block of
conv3, conv4 and conv5 halves the resolution with a stride-2 3×3 convolution; the paper puts that
stride on the first 1×1 convolution (3.8 G multiply-adds at 224×224), while torchvision and
MLPerf put it on the 3×3 ("ResNet-50 v1.5", 4.1 G multiply-adds): we follow the latter.

The stem is the paper's (``stem_stride=4``: 7×7 convolution with stride 2, BN, ReLU, 3×3 max-pool
with stride 2; the paper lists the pool under conv2_x) or the usual CIFAR adaptation
(``stem_stride=1``: 3×3 convolution with stride 1, BN, ReLU, no pool).

``resnet50`` is the ImageNet model (S = 224, 1000 classes, 25,557,032 parameters, about 8.2 GFLOP
forward per sample); ``resnet50-32`` is a narrow CIFAR-sized one (S = 32, CIFAR stem, w = 1/4, 10
classes) that trains on a CPU. The blocks per stage (3, 4, 6, 3) are settings, so tests can build
shallower ones. Channel counts are ``max(1, round(c·w))`` (the 4× expansion is kept exactly).

BatchNorm (training mode) normalises over each micro-batch, so unlike VGG-16 a pipelined run does
not compute exactly the numbers of unpipelined training, and unequal micro-batches change the
statistics too (docs/algorithms.md §2.6). Every BatchNorm sees at least 2×2 values per channel (the image
size is checked), so micro-batches of one sample work. Weights: He-normal (fan-out) convolutions,
BN scale 1 and shift 0, the classifier with torch's default initialisation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["Bottleneck", "Head", "ResNetConfig", "Stem", "build"]

EXPANSION = 4  # a bottleneck's output channels over its inner channels
STEM_CHANNELS = 64
STAGE_CHANNELS: tuple[int, ...] = (64, 128, 256, 512)  # inner channels of conv2_x … conv5_x
_STEM_STRIDES = (1, 4)
_MIN_FINAL_SIDE = 2  # BatchNorm in training needs more than one value per channel


@dataclass(frozen=True)
class ResNetConfig:
    """Sizes of a bottleneck ResNet (ResNet-50 by default).

    Attributes:
        image: input height and width in pixels (S).
        classes: output logits per sample.
        width: multiplier on every channel count.
        stem_stride: 4 for the ImageNet stem (7×7/2 convolution and 3×3/2 max-pool), 1 for the
            CIFAR stem (3×3/1 convolution, no pool).
        conv2_blocks: bottleneck blocks in stage conv2_x (at S/r).
        conv3_blocks: blocks in conv3_x (at S/2r).
        conv4_blocks: blocks in conv4_x (at S/4r).
        conv5_blocks: blocks in conv5_x (at S/8r).
    """

    image: int = 224
    classes: int = 1000
    width: float = 1.0
    stem_stride: int = 4
    conv2_blocks: int = 3
    conv3_blocks: int = 4
    conv4_blocks: int = 6
    conv5_blocks: int = 3

    def __post_init__(self) -> None:
        if self.stem_stride not in _STEM_STRIDES:
            raise UserError(
                f"resnet: stem_stride={self.stem_stride} is not a stem; use 4 (ImageNet: 7×7/2 "
                "convolution and max-pool) or 1 (CIFAR: 3×3/1 convolution)"
            )
        reduction = self.stem_stride * 8
        if self.image % reduction or self.image // reduction < _MIN_FINAL_SIDE:
            raise UserError(
                f"resnet: image={self.image} with stem_stride={self.stem_stride} must be a multiple "
                f"of {reduction} and at least {_MIN_FINAL_SIDE * reduction} (the last stage needs 2×2 "
                "values per channel for BatchNorm with one-sample micro-batches); choose e.g. "
                f"image={max(_MIN_FINAL_SIDE, self.image // reduction) * reduction}, or stem_stride=1"
            )

    @property
    def blocks(self) -> tuple[int, ...]:
        """Blocks per stage, conv2_x to conv5_x."""
        return (self.conv2_blocks, self.conv3_blocks, self.conv4_blocks, self.conv5_blocks)

    def scaled(self, channels: int) -> int:
        return max(1, round(channels * self.width))


def _conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """A bias-free convolution (BN follows), He-normal over fan-out, "same" padding."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


class Stem(nn.Sequential):
    """``conv1``: ``[b, 3, S, S]`` → ``[b, c_out, S/stride, S/stride]`` (stride 4 or 1)."""

    def __init__(self, c_out: int, stride: int) -> None:
        if stride == 1:
            super().__init__(_conv(3, c_out, 3), nn.BatchNorm2d(c_out), nn.ReLU())
        else:
            pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            super().__init__(_conv(3, c_out, 7, stride=2), nn.BatchNorm2d(c_out), nn.ReLU(), pool)


class Bottleneck(nn.Module):
    """A bottleneck block: ``[b, c_in, s, s]`` → ``[b, 4·inner, s/stride, s/stride]``."""

    def __init__(self, c_in: int, inner: int, stride: int) -> None:
        super().__init__()
        c_out = EXPANSION * inner
        self.branch = nn.Sequential(
            _conv(c_in, inner, 1), nn.BatchNorm2d(inner), nn.ReLU(),
            _conv(inner, inner, 3, stride=stride), nn.BatchNorm2d(inner), nn.ReLU(),
            _conv(inner, c_out, 1), nn.BatchNorm2d(c_out),
        )  # fmt: skip
        self.shortcut = (
            nn.Identity()
            if stride == 1 and c_in == c_out
            else nn.Sequential(_conv(c_in, c_out, 1, stride=stride), nn.BatchNorm2d(c_out))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class Head(nn.Sequential):
    """``fc``: global average pool and the classifier, ``[b, c, s, s]`` → ``[b, classes]``."""

    def __init__(self, c_in: int, classes: int) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes))


def _blocks(config: ResNetConfig, c_in: int) -> tuple[tuple[Layer, ...], int]:
    """The bottleneck layers ``conv2_1 …``, and the channels they end with."""
    layers = []
    for stage, (inner, n_blocks) in enumerate(zip(STAGE_CHANNELS, config.blocks, strict=True), start=2):
        for j in range(1, n_blocks + 1):
            stride = 2 if j == 1 and stage > 2 else 1
            factory = functools.partial(Bottleneck, c_in, config.scaled(inner), stride)
            layers.append(Layer(f"conv{stage}_{j}", factory))
            c_in = EXPANSION * config.scaled(inner)
    return tuple(layers), c_in


def build(config: ResNetConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``conv1``, ``conv2_1 … conv5_{n}``, ``fc``."""
    stem_channels = config.scaled(STEM_CHANNELS)
    stem = Layer("conv1", functools.partial(Stem, stem_channels, config.stem_stride))
    blocks, channels = _blocks(config, stem_channels)
    head = Layer("fc", functools.partial(Head, channels, config.classes))
    return LayerGraph(
        name=name,
        layers=(stem, *blocks, head),
        input=TensorSpec((3, config.image, config.image)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
