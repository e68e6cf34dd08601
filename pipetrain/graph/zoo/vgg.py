"""VGG-16 (configuration D) without BatchNorm: 13 convolutional and 3 fully connected layers.

After Simonyan and Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
Recognition" (arXiv:1409.1556, 2014), Table 1, column D. Each pipeline layer is one 3×3
convolution (stride 1, padding 1) with its ReLU; the five 2×2 max-pools are folded into the
convolution before them, so the graph has exactly 16 layers::

    conv1_1, conv1_2+pool   [b, 3, S, S]        -> [b, 64, S/2, S/2]
    conv2_1, conv2_2+pool                       -> [b, 128, S/4, S/4]
    conv3_1 … conv3_3+pool                      -> [b, 256, S/8, S/8]
    conv4_1 … conv4_3+pool                      -> [b, 512, S/16, S/16]
    conv5_1 … conv5_3+pool                      -> [b, 512, S/32, S/32]
    fc6  flatten, Linear(512·(S/32)² → F), ReLU -> [b, F]
    fc7  Linear(F → F), ReLU                    -> [b, F]
    fc8  Linear(F → classes)                    -> [b, classes] logits

``vgg16`` is the paper's ImageNet model (S = 224, F = 4096, 1000 classes, 138.4 M parameters);
``vgg16-32`` is the common CIFAR-10 adaptation (S = 32, F = 512, 10 classes). Channel counts and F
are multiplied by ``width`` (rounded, at least 1) so tests can use a thin network. There is no
BatchNorm, so micro-batching does not change the mathematics (docs/algorithms.md §2.6), and no dropout.
Weights: He-normal (fan-out) convolutions and N(0, 0.01) linear layers, zero biases.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["ConvLayer", "LinearLayer", "VGGConfig", "build"]

# Table 1, column D: (output channels, convolutions) per group; each group ends in a max-pool.
CONFIG_D: tuple[tuple[int, int], ...] = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))
_POOLS = len(CONFIG_D)


@dataclass(frozen=True)
class VGGConfig:
    """Sizes of a VGG-16.

    Attributes:
        image: input height and width in pixels (S); a multiple of 32.
        classes: output logits per sample.
        fc: units of the two hidden fully connected layers (F), before ``width``.
        width: multiplier on every channel count and on ``fc``.
    """

    image: int = 224
    classes: int = 1000
    fc: int = 4096
    width: float = 1.0

    def __post_init__(self) -> None:
        if self.image % (1 << _POOLS):
            raise UserError(
                f"vgg: image={self.image} is not a multiple of 32 (VGG halves it five times); "
                "choose e.g. 32, 64 or 224"
            )

    def scaled(self, units: int) -> int:
        return max(1, round(units * self.width))


class ConvLayer(nn.Sequential):
    """``Conv3x3, ReLU`` and optionally ``MaxPool 2×2``.

    Maps ``[b, c_in, s, s]`` to ``[b, c_out, s, s]``, or ``[b, c_out, s/2, s/2]`` with the pool.
    """

    def __init__(self, c_in: int, c_out: int, pool: bool) -> None:
        conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(conv.get_parameter("bias"))
        tail: list[nn.Module] = [nn.MaxPool2d(2)] if pool else []
        super().__init__(conv, nn.ReLU(), *tail)


class LinearLayer(nn.Sequential):
    """[Flatten], Linear, [ReLU]: ``[b, …]`` → ``[b, d_out]``."""

    def __init__(self, d_in: int, d_out: int, flatten: bool, relu: bool) -> None:
        linear = nn.Linear(d_in, d_out)
        nn.init.normal_(linear.weight, std=0.01)
        nn.init.zeros_(linear.bias)
        head: list[nn.Module] = [nn.Flatten()] if flatten else []
        tail: list[nn.Module] = [nn.ReLU()] if relu else []
        super().__init__(*head, linear, *tail)


def _conv_layers(config: VGGConfig) -> tuple[tuple[Layer, ...], int]:
    """The 13 convolutional layers, and the channels they end with."""
    layers = []
    c_in = 3
    for group, (channels, n_convs) in enumerate(CONFIG_D, start=1):
        c_out = config.scaled(channels)
        for j in range(1, n_convs + 1):
            factory = functools.partial(ConvLayer, c_in, c_out, j == n_convs)
            layers.append(Layer(f"conv{group}_{j}", factory))
            c_in = c_out
    return tuple(layers), c_in


def build(config: VGGConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``conv1_1 … conv5_3``, ``fc6``, ``fc7``, ``fc8``."""
    convs, channels = _conv_layers(config)
    side = config.image >> _POOLS
    fc = config.scaled(config.fc)
    fcs = (
        Layer("fc6", functools.partial(LinearLayer, channels * side * side, fc, True, True)),
        Layer("fc7", functools.partial(LinearLayer, fc, fc, False, True)),
        Layer("fc8", functools.partial(LinearLayer, fc, config.classes, False, False)),
    )
    return LayerGraph(
        name=name,
        layers=convs + fcs,
        input=TensorSpec((3, config.image, config.image)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
