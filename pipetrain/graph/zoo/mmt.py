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
from pipetrain.graph.zoo.gpt import Block, init_weights

__all__ = ["MMTConfig", "ModalityEmbed", "PoolHead", "build"]



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


class ModalityEmbed(nn.Module):
    """A branch's source layer: its slice ``x[..., start:start+F]`` of the model input ``[b, T, B·F]``,
    projected to ``[b, T, H]``, plus a learned position embedding."""

    def __init__(self, start: int, features: int, seq: int, hidden: int) -> None:
        super().__init__()
        self.start, self.features = start, features
        self.proj = nn.Linear(features, hidden)
        self.position = nn.Embedding(seq, hidden)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = x[..., self.start : self.start + self.features]
        positions = torch.arange(x.shape[1], device=x.device)
        out: torch.Tensor = self.proj(part) + self.position(positions)
        return out


class PoolHead(nn.Module):
    """LayerNorm, mean over tokens, Linear: ``[b, T, D]`` → ``[b, classes]`` logits."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, classes)
        init_weights(self)

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
        block = functools.partial(Block, c.hidden, c.heads, c.ffn, False)  # bidirectional encoder blocks
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
