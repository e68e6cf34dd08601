"""MMT: a multi-modal transformer, parallel transformer branches concatenated at the end (a DAG).

GraphPipe's (Jeon et al., ASPLOS'25) App. A.2 model: 4 parallel branches × 8 transformer layers,
concatenated at the end; sequence 256, hidden 1024, 16 heads, FFN 4096 (``mmt``;
docs/algorithms.md §5). The paper does not say what the inputs or the head are; ours: the model input is
one float tensor ``[T, branches · features]``, the ``features``-wide slices side by side being the
modalities' per-token features (e.g. precomputed embeddings of text, audio, video), and branch ``i``
projects its own slice. With ``B`` branches of ``L`` blocks, ``H`` hidden and ``T`` tokens::

    b{i}_embed    x[..., i·F:(i+1)·F] → Linear(F → H) + learned positions   [b, T, B·F] → [b, T, H]
    b{i}_block{j} x + MHA(LN(x)); x + FFN(LN(x)) (GELU), bidirectional               → [b, T, H]
    concat        the B branches' last blocks, on features                           → [b, T, B·H]
    head          LN, mean over tokens, Linear(B·H → classes)                        → [b, classes]

Layers are ordered branch by branch (``b0_embed, b0_block0, …, b1_embed, …``), then ``concat`` and
``head``: ``B · (L + 1) + 2`` layers, 38 for ``mmt``. Weights start from N(0, 0.02) (GPT-style),
biases at zero; no dropout. Targets are one int64 class per sample (``LossKind.CROSS_ENTROPY``).
``mmt-tiny`` keeps 4 branches of 2 blocks with T = 8, H = 32, 4 heads, FFN 128, and trains on a CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo.branches import Concat, DagBuilder

__all__ = ["EncoderBlock", "MMTConfig", "ModalityEmbed", "PoolHead", "build"]

INIT_STD = 0.02


@dataclass(frozen=True)
class MMTConfig:
    """Sizes of an MMT.

    Attributes:
        branches: parallel transformer branches (modalities), B.
        layers: transformer blocks per branch, L.
        seq: tokens per sample, T.
        hidden: model width of every branch, H; a multiple of ``heads``.
        heads: attention heads.
        ffn: hidden units of each block's feed-forward layer.
        features: input features per token and modality, F (the input is ``[T, B·F]``).
        classes: output logits per sample.
    """

    branches: int = 4
    layers: int = 8
    seq: int = 256
    hidden: int = 1024
    heads: int = 16
    ffn: int = 4096
    features: int = 1024
    classes: int = 1000

    def __post_init__(self) -> None:
        if self.heads > 0 and self.hidden % self.heads:
            raise UserError(f"mmt: hidden={self.hidden} is not divisible by heads={self.heads}; "
                            "choose heads that divide hidden")


def _init(module: nn.Module) -> None:
    """N(0, 0.02) weights of Linear and Embedding layers, zero biases (LayerNorm keeps its 1/0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=INIT_STD)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class ModalityEmbed(nn.Module):
    """A branch's source layer: its slice ``x[..., start:start+F]`` of the model input ``[b, T, B·F]``,
    projected to ``[b, T, H]``, plus a learned position embedding."""

    def __init__(self, start: int, features: int, seq: int, hidden: int) -> None:
        super().__init__()
        self.start, self.features = start, features
        self.proj = nn.Linear(features, hidden)
        self.position = nn.Embedding(seq, hidden)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = x[..., self.start : self.start + self.features]
        positions = torch.arange(x.shape[1], device=x.device)
        out: torch.Tensor = self.proj(part) + self.position(positions)
        return out


class EncoderBlock(nn.Module):
    """A pre-LN bidirectional transformer block: ``[b, T, H]`` → ``[b, T, H]``."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
        _init(self)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention over all tokens: ``[b, T, H]`` → ``[b, T, H]``."""
        b, t, h = x.shape
        # [b, T, 3H] -> 3 x [b, heads, T, H / heads]
        q, k, v = (
            part.view(b, t, self.heads, h // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(h, dim=2)
        )
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, h))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class PoolHead(nn.Module):
    """LayerNorm, mean over tokens, Linear: ``[b, T, D]`` → ``[b, classes]`` logits."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, classes)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.norm(x).mean(dim=1))
        return out


def build(config: MMTConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: B branches of ``b{i}_embed, b{i}_block0 …``, ``concat``, ``head``."""
    c = config
    dag = DagBuilder()
    ends = []
    for i in range(c.branches):
        embed = dag.add(f"b{i}_embed", functools.partial(ModalityEmbed, i * c.features, c.features, c.seq, c.hidden))
        block = functools.partial(EncoderBlock, c.hidden, c.heads, c.ffn)
        ends.append(dag.chain(f"b{i}_block", [block] * c.layers, after=embed))
    merged = dag.add("concat", Concat, ends)
    dag.add("head", functools.partial(PoolHead, c.branches * c.hidden, c.classes), (merged,))
    return dag.graph(
        name,
        input=TensorSpec((c.seq, c.branches * c.features)),
        target=TensorSpec((), "int64", high=c.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
