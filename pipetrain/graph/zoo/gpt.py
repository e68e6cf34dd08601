"""GPT: a decoder-only transformer language model, one pipeline layer per transformer block.

After Radford, Narasimhan, Salimans and Sutskever, "Improving Language Understanding by Generative
Pre-Training" (OpenAI, 2018): 12 blocks, 768 hidden units, 12 attention heads, a 3072-unit GELU
feed-forward layer, 512-token context, a 40,478-token BPE vocabulary, and weights initialised from
N(0, 0.02). The ``gpt1-14`` preset has exactly these sizes and 14 pipeline layers::

    embed    [b, T] int64    -> [b, T, H]   token + learned position embedding
    block_i  [b, T, H]       -> [b, T, H]   x + attn(LN(x)); x + MLP(LN(x))   (i = 0 … 11)
    head     [b, T, H]       -> [b, T, V]   final LayerNorm, Linear(H → V) without bias

Differences from the paper, chosen for pipelining: blocks are pre-LN (LayerNorm before each
sub-layer, as in GPT-2) with a final LayerNorm in the head, which trains stably without warm-up
tuning; the head is *not* tied to the token embedding (each layer here is built by its own
factory; a captured model may tie them, docs/architecture.md §6); there is no dropout, so a
pipelined run and its unpipelined reference compute the same numbers. Parameters of ``gpt1-14``:
116.5 M without the head (GPT-1's "117M", whose head was the tied embedding), 147.6 M with the
untied head.

Attention is causal and uses ``torch.nn.functional.scaled_dot_product_attention``. The loss is
``LossKind.LM``: targets are the next tokens, ``[b, T]`` int64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["Block", "Embedding", "GPTConfig", "Head", "SelfAttention", "build", "init_weights"]

INIT_STD = 0.02  # GPT-1 §4.1: "weights initialized from N(0, 0.02)"


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT.

    Attributes:
        vocab: tokens in the vocabulary (V).
        context: tokens per sample (T), also the number of learned positions.
        hidden: model width (H).
        heads: attention heads; must divide ``hidden``.
        blocks: transformer blocks (pipeline layers besides ``embed`` and ``head``).
    """

    vocab: int = 40478
    context: int = 512
    hidden: int = 768
    heads: int = 12
    blocks: int = 12

    def __post_init__(self) -> None:
        if self.heads > 0 and self.hidden % self.heads:
            raise UserError(
                f"gpt: hidden={self.hidden} is not divisible by heads={self.heads}; "
                "choose heads that divide hidden"
            )


def init_weights(module: nn.Module) -> None:
    """GPT-1 initialisation: N(0, 0.02) weights, zero biases (LayerNorm keeps its 1/0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=INIT_STD)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class Embedding(nn.Module):
    """Token plus learned position embedding: ``[b, T]`` int64 → ``[b, T, H]``."""

    def __init__(self, vocab: int, context: int, hidden: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(context, hidden)
        init_weights(self)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        out: torch.Tensor = self.token(idx) + self.position(positions)
        return out


class SelfAttention(nn.Module):
    """Multi-head self-attention, causal (GPT) or over all tokens (an encoder): ``[b, T, H]`` → ``[b, T, H]``."""

    def __init__(self, hidden: int, heads: int, causal: bool = True) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        # [b, T, 3H] -> 3 x [b, heads, T, H / heads]
        q, k, v = (
            part.view(b, t, self.heads, h // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(h, dim=2)
        )
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, h))
        return out


class Block(nn.Module):
    """A pre-LN transformer block: ``[b, T, H]`` → ``[b, T, H]``; FFN width ``ffn`` (default ``4H``),
    causal attention unless ``causal=False`` (the encoder blocks of ``mmt``)."""

    def __init__(self, hidden: int, heads: int, ffn: int | None = None, causal: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads, causal)
        self.ln2 = nn.LayerNorm(hidden)
        width = 4 * hidden if ffn is None else ffn
        self.mlp = nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, hidden))
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class Head(nn.Sequential):
    """Final LayerNorm and the language-model head: ``[b, T, H]`` → ``[b, T, V]`` logits."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__(nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False))
        init_weights(self)


def build(config: GPTConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``embed``, ``block0 … block{blocks-1}``, ``head``."""
    c = config
    embed = Layer("embed", functools.partial(Embedding, c.vocab, c.context, c.hidden))
    blocks = tuple(
        Layer(f"block{i}", functools.partial(Block, c.hidden, c.heads)) for i in range(c.blocks)
    )
    head = Layer("head", functools.partial(Head, c.hidden, c.vocab))
    tokens = TensorSpec((c.context,), "int64", high=c.vocab)
    return LayerGraph(
        name=name,
        layers=(embed, *blocks, head),
        input=tokens,
        target=tokens,
        loss=LossKind.LM,
        seed=seed,
    )
