"""Small models built like torchvision's ResNet, MobileNet-V2 and VisionTransformer (issue 26 §2).

torchvision's wheel cannot be imported everywhere we test, so these rebuild the structure that
matters to capture, with the same module names (so the same ``state_dict`` keys) at small widths:

* :class:`ResNetLike`: stem ``conv1`` (3×3, or torchvision's 7×7 of stride 2), ``bn1``, in-place
  ``relu``, ``maxpool``; ``layer1``…``layer4`` Sequentials of :class:`BasicBlock` (BatchNorm, a
  ``downsample`` Sequential where the shape changes, the residual added in place); ``avgpool``,
  ``fc``. :func:`resnet18` is torchvision's ResNet-18 (widths 64 to 512).
* :class:`MobileNetV2Like`: ``features``, a Sequential of :class:`ConvNormActivation` (a Sequential
  ending in ``ReLU6(inplace=True)``, like ``Conv2dNormActivation``) and :class:`InvertedResidual`
  blocks; ``classifier``, a Sequential of Dropout and Linear.
* :class:`ViTLike`: ``conv_proj`` cuts ``[3, H, W]`` into patches, a ``class_token`` is prepended,
  ``encoder`` (holding ``pos_embedding``, ``dropout``, ``layers`` of :class:`EncoderBlock`
  and ``ln``) and ``heads``.

Inputs are images ``[b, 3, 16, 16]``; outputs ``[b, classes]``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

IMAGE = (3, 16, 16)
CLASSES = 10


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3×3 convolutions, BatchNorm, an identity or ``downsample`` skip."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)  # type: ignore[no-any-return]


class ResNetLike(nn.Module):
    """``[b, 3, H, W]`` → ``[b, classes]``: a ResNet-18 of widths ``widths`` and ``blocks`` per stage."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), widths: tuple[int, ...] = (4, 8, 8, 16),
                 classes: int = CLASSES, torchvision_stem: bool = False) -> None:
        super().__init__()
        # torchvision's stem is a 7×7 convolution of stride 2 (for 224×224); 3×3, stride 1 keeps small images whole
        stem = (7, 2, 3) if torchvision_stem else (3, 1, 1)
        self.conv1 = nn.Conv2d(3, widths[0], *stem, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = widths[0]
        for i, (count, planes) in enumerate(zip(blocks, widths, strict=True)):
            stride = 1 if i == 0 else 2
            self.add_module(f"layer{i + 1}", self._make_layer(inplanes, planes, count, stride))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, classes)

    @staticmethod
    def _make_layer(inplanes: int, planes: int, count: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        first = BasicBlock(inplanes, planes, stride, downsample)
        return nn.Sequential(first, *(BasicBlock(planes, planes) for _ in range(count - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]


def resnet18(classes: int = CLASSES) -> ResNetLike:
    """torchvision's ``resnet18(num_classes=classes)``: its stem, BasicBlocks [2, 2, 2, 2], widths 64 to 512."""
    return ResNetLike(widths=(64, 128, 256, 512), classes=classes, torchvision_stem=True)


class ConvNormActivation(nn.Sequential):
    """torchvision's ``Conv2dNormActivation``: convolution, BatchNorm, ``ReLU6(inplace=True)``."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """MobileNet-V2's block: 1×1 expansion (unless ``expand`` is 1), 3×3 depthwise, 1×1 linear
    projection, in ``conv`` (a Sequential); the input added back where shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = [ConvNormActivation(cin, hidden, kernel=1)] if expand != 1 else []
        layers += [ConvNormActivation(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)  # type: ignore[no-any-return]
        return self.conv(x)  # type: ignore[no-any-return]


class MobileNetV2Like(nn.Module):
    """``[b, 3, H, W]`` → ``[b, classes]``: stem, four inverted-residual blocks, a 1×1 head convolution."""

    def __init__(self, classes: int = CLASSES, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            ConvNormActivation(3, 8, stride=2),
            InvertedResidual(8, 8, 1, 1),
            InvertedResidual(8, 12, 2, 4),
            InvertedResidual(12, 12, 1, 4),
            ConvNormActivation(12, 32, kernel=1),
        )
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))  # type: ignore[no-any-return]


class MLPBlock(nn.Sequential):
    """torchvision's ViT MLP: Linear, GELU, Dropout, Linear, Dropout."""

    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width),
                         nn.Dropout(dropout))


class EncoderBlock(nn.Module):
    """A pre-norm transformer block ``[b, s, width]`` → ``[b, s, width]``."""

    def __init__(self, heads: int, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = MLPBlock(width, hidden, dropout)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + input
        return x + self.mlp(self.ln_2(x))  # type: ignore[no-any-return]


class Encoder(nn.Module):
    """Position embedding (a parameter of its own), dropout, the blocks ``layers``, a final LayerNorm."""

    def __init__(self, seq: int, layers: int, heads: int, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, width).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(OrderedDict(
            (f"encoder_layer_{i}", EncoderBlock(heads, width, hidden, dropout)) for i in range(layers)))
        self.ln = nn.LayerNorm(width, eps=1e-6)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        torch._assert(input.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {input.shape}")
        return self.ln(self.layers(self.dropout(input + self.pos_embedding)))  # type: ignore[no-any-return]


class ViTLike(nn.Module):
    """``[b, 3, size, size]`` → ``[b, classes]``: patches of ``patch``² pixels, a class token, ``layers`` blocks."""

    def __init__(self, size: int = IMAGE[1], patch: int = 4, layers: int = 3, heads: int = 2, width: int = 16,
                 hidden: int = 32, classes: int = CLASSES, dropout: float = 0.0) -> None:
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = size, patch, width
        self.conv_proj = nn.Conv2d(3, width, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder((size // patch) ** 2 + 1, layers, heads, width, hidden, dropout)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(width, classes)))

    def _process_input(self, x: torch.Tensor) -> torch.Tensor:
        """``[n, 3, h, w]`` → ``[n, patches, width]``."""
        n, _, h, w = x.shape
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")
        x = self.conv_proj(x)
        x = x.reshape(n, self.hidden_dim, (h // self.patch_size) * (w // self.patch_size))
        return x.permute(0, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._process_input(x)
        token = self.class_token.expand(x.shape[0], -1, -1)
        x = self.encoder(torch.cat([token, x], dim=1))
        return self.heads(x[:, 0])  # type: ignore[no-any-return]
