"""A tiny Vision Transformer (Dosovitskiy et al. 2021) for the 8×8 digits, ``vit-digits``.

Pre-norm transformer blocks over patch tokens, one pipeline layer each, the uniform kind of block on
which PPLL reports its largest gain (docs/algorithms.md §6). With ``p`` the patch side, ``N =
(S/p)²`` tokens and ``D`` the width::

    embed    patchify (Conv p×p, stride p), + learned positions   [b, 1, S, S] -> [b, N, D]
    block_i  x + MHA(LN(x)); x + MLP(LN(x)) (GELU, hidden 2D)                  -> [b, N, D]
    head     LN, mean over tokens, Linear(D → classes)                          -> [b, classes]

The ``vit-digits`` preset: S = 8, p = 2 (N = 16), D = 32, 4 heads, 4 blocks, 10 classes; no
dropout, so pipelined runs compute the numbers of an unpipelined one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["PatchEmbed", "TokenClassifier", "ViTBlock", "ViTConfig", "build"]


@dataclass(frozen=True)
class ViTConfig:
    """Sizes of a ViT.

    Attributes:
        image: input height and width (S); a multiple of ``patch``.
        patch: patch side (p).
        width: token features (D); a multiple of ``heads``.
        heads: attention heads.
        blocks: transformer blocks.
        classes: output logits per sample.
    """

    image: int = 8
    patch: int = 2
    width: int = 32
    heads: int = 4
    blocks: int = 4
    classes: int = 10

    def __post_init__(self) -> None:
        if self.image % self.patch or self.width % self.heads:
            raise UserError(f"vit: image={self.image} must be a multiple of patch={self.patch} and width="
                            f"{self.width} a multiple of heads={self.heads}; change one of them")


class PatchEmbed(nn.Module):
    """``[b, 1, S, S]`` → ``[b, N, D]``: non-overlapping patches, linearly embedded, plus positions."""

    def __init__(self, image: int, patch: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(1, width, patch, stride=patch)
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x).flatten(2).transpose(1, 2) + self.position
        return out


class ViTBlock(nn.Module):
    """A pre-norm transformer block: ``[b, N, D]`` → ``[b, N, D]``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TokenClassifier(nn.Module):
    """``[b, N, D]`` → ``[b, classes]``: LayerNorm, mean over tokens, linear classifier."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.norm(x).mean(dim=1))
        return out


def build(config: ViTConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``embed, block0 … block{blocks-1}, head``."""
    embed = Layer("embed", functools.partial(PatchEmbed, config.image, config.patch, config.width))
    blocks = [Layer(f"block{i}", functools.partial(ViTBlock, config.width, config.heads)) for i in range(config.blocks)]
    head = Layer("head", functools.partial(TokenClassifier, config.width, config.classes))
    return LayerGraph(
        name=name,
        layers=(embed, *blocks, head),
        input=TensorSpec((1, config.image, config.image)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
