"""GNMT: an LSTM encoder-decoder with attention, reduced to a chain of pipeline layers.

After Wu et al., "Google's Neural Machine Translation System: Bridging the Gap between Human and
Machine Translation" (arXiv:1609.08144, 2016), the translation model of the PipeDream and BaPipe
benchmarks (docs/algorithms.md §3, §4). What is GNMT's here:

* 8 encoder and 8 decoder LSTM layers of 1024 units (§3); the bottom encoder layer is
  bidirectional, its two 1024-unit directions concatenated into the second layer's 2048 inputs
  (§3.2);
* residual connections around every LSTM layer from the third on, in the encoder and in the
  decoder (§3.1);
* additive attention, a feed-forward network with one hidden layer (§3): ``score(s) = vᵀ
  tanh(W_q y_t + W_k m_s + b)``, softmax over the source positions, and the context is the
  weighted sum of the top encoder layer's outputs ``m_s``; the query is the bottom decoder layer's
  output and the context is an input of the decoder layers;
* the softmax over the output vocabulary on the top decoder layer, and all weights drawn
  uniformly from ±0.04 (§8.2).

What is ours, so that one tensor passes between consecutive layers:

* the attention query is the bottom decoder layer's output at the same step, not the previous
  one, and the context is fed to every decoder layer above the bottom one, not to the bottom one
  (the "GNMT v2" attention of NVIDIA's and MLPerf's reference implementations), so that all
  steps' attention is computed at once after the bottom decoder layer;
* the tensor between layers carries two halves on the feature axis, ``[b, T, 2H]``: in the
  encoder the current encoder states and the (untouched) decoder-input embeddings, in the decoder
  the attention context and the current decoder states; the first encoder layer's output has
  ``3H`` features (two directions and the embeddings);
* a sample is a source sentence and a decoder-input sentence of the same length T (``[b, 2, T]``
  int64 token ids: row 0 the source, row 1 the target shifted right, as teacher forcing feeds
  it); there is no padding, masking, beam search or length normalisation; the target is ``[b, T]``
  next tokens, scored with per-token cross-entropy (``LossKind.LM``);
* one embedding table serves source and decoder-input tokens (GNMT shares its wordpiece
  vocabulary between the two languages); no dropout, so a pipelined run computes the same numbers
  as unpipelined training; LSTMs are :class:`pipetrain.graph.zoo.lstm.LSTM`.

The layers, with ``E`` encoder and ``D`` decoder layers (``E`` ≥ 2)::

    embed     [b, 2, T] int64 -> [b, T, 2H]   [src emb | dec emb]
    enc0      -> [b, T, 3H]   [fwd LSTM(src) | bwd LSTM(src) | dec emb]
    enc1      -> [b, T, 2H]   [LSTM(2H → H) | dec emb]
    enc2…     -> [b, T, 2H]   [m + LSTM(m) | dec emb]
    dec0      -> [b, T, 2H]   [context | y = LSTM(dec emb)], attention over the encoder states m
    dec1      -> [b, T, 2H]   [context | LSTM([context | y])]
    dec2…     -> [b, T, 2H]   [context | y + LSTM([context | y])]
    head      -> [b, T, V]    Linear(H → V)(y) logits

``gnmt`` has GNMT's 8 + 8 layers (PipeDream's "GNMT-16"), a 32,000-token vocabulary and
sentences of 50 tokens (MLPerf's training length limit): 18 layers, 243,967,232 parameters. We
chose 8 + 8 over the 4 + 4 of MLPerf's reference (PipeDream's "GNMT-8"; ``encoder_layers=4,
decoder_layers=4``) because it is the model the paper describes and the deeper of PipeDream's two,
the one where a pipeline has more layers to balance. ``gnmt-tiny`` (V = 256, T = 16, H = 64,
3 + 3 layers, so every kind of layer occurs) trains on a CPU: 10 steps of 16 samples take about
0.5 s on one core.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo.lstm import LSTM

__all__ = [
    "AdditiveAttention",
    "AttentionDecoderLayer",
    "BidirectionalEncoderLayer",
    "DecoderLayer",
    "EncoderLayer",
    "GNMTConfig",
    "Head",
    "TokenEmbedding",
    "build",
]

INIT_RANGE = 0.04  # Wu et al. §8.2: parameters uniformly initialised in [-0.04, 0.04]
RESIDUAL_FROM = 2  # 0-based index of the first layer with a residual connection ("layer 3")
_MIN_ENCODER_LAYERS = 2


@dataclass(frozen=True)
class GNMTConfig:
    """Sizes of a GNMT.

    Attributes:
        vocab: tokens in the shared vocabulary (V).
        length: tokens per sentence (T), for the source and the target alike.
        hidden: LSTM units per direction, also the embedding and attention width (H).
        encoder_layers: encoder LSTM layers (E), the first bidirectional; at least 2.
        decoder_layers: decoder LSTM layers (D), the first computing the attention.
    """

    vocab: int = 32000
    length: int = 50
    hidden: int = 1024
    encoder_layers: int = 8
    decoder_layers: int = 8

    def __post_init__(self) -> None:
        if self.encoder_layers < _MIN_ENCODER_LAYERS:
            raise UserError(
                f"gnmt: encoder_layers={self.encoder_layers} is too few; the encoder needs its "
                "bidirectional layer and one more that merges the two directions: use 2 or more"
            )


def _init(module: nn.Module) -> nn.Module:
    """Wu et al.'s initialisation: every parameter uniform in ±0.04."""
    for p in module.parameters():
        nn.init.uniform_(p, -INIT_RANGE, INIT_RANGE)
    return module


class TokenEmbedding(nn.Module):
    """``embed``: ``[b, 2, T]`` int64 (source row, decoder-input row) → ``[b, T, 2H]``."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.table = _init(nn.Embedding(vocab, hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded: torch.Tensor = self.table(tokens)  # [b, 2, T, H]
        return embedded.transpose(1, 2).flatten(2)


class BidirectionalEncoderLayer(nn.Module):
    """``enc0``: ``[b, T, 2H]`` → ``[b, T, 3H]``, both directions over the source half."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.forward_lstm = _init(LSTM(hidden, hidden))
        self.backward_lstm = _init(LSTM(hidden, hidden, reverse=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        source, decoder = torch.split(x, self.hidden, dim=2)
        return torch.cat((self.forward_lstm(source), self.backward_lstm(source), decoder), dim=2)


class EncoderLayer(nn.Module):
    """``enc1 …``: ``[b, T, inputs + H]`` → ``[b, T, 2H]``, an LSTM over the first ``inputs``."""

    def __init__(self, inputs: int, hidden: int, residual: bool) -> None:
        super().__init__()
        self.inputs = inputs
        self.residual = residual
        self.lstm = _init(LSTM(inputs, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, decoder = torch.split(x, [self.inputs, x.shape[2] - self.inputs], dim=2)
        out = self.lstm(states)
        if self.residual:
            out = out + states
        return torch.cat((out, decoder), dim=2)


class AdditiveAttention(nn.Module):
    """``context[b, t] = Σ_s softmax_s(vᵀ tanh(W_q y_t + W_k m_s + b)) m_s``.

    Queries ``y`` ``[b, T, H]``, memory ``m`` ``[b, T, H]`` → context ``[b, T, H]``; the scores
    use a ``[b, T, T, H]`` intermediate.
    """

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden, bias=False)
        self.key = nn.Linear(hidden, hidden)  # its bias is b
        self.score = nn.Parameter(torch.empty(hidden))  # v

    def forward(self, y: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.query(y).unsqueeze(2) + self.key(memory).unsqueeze(1))
        weights = torch.softmax(torch.matmul(hidden, self.score), dim=2)  # [b, T_query, T_memory]
        return torch.bmm(weights, memory)


class AttentionDecoderLayer(nn.Module):
    """``dec0``: ``[b, T, 2H]`` (memory, decoder embeddings) → ``[b, T, 2H]`` (context, states)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm = _init(LSTM(hidden, hidden))
        self.attention = _init(AdditiveAttention(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory, embedded = torch.split(x, self.hidden, dim=2)
        y = self.lstm(embedded)
        return torch.cat((self.attention(y, memory), y), dim=2)


class DecoderLayer(nn.Module):
    """``dec1 …``: ``[b, T, 2H]`` (context, states) → the same, an LSTM over both halves."""

    def __init__(self, hidden: int, residual: bool) -> None:
        super().__init__()
        self.hidden = hidden
        self.residual = residual
        self.lstm = _init(LSTM(2 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context, y = torch.split(x, self.hidden, dim=2)
        out = self.lstm(x)
        if self.residual:
            out = out + y
        return torch.cat((context, out), dim=2)


class Head(nn.Module):
    """``head``: ``[b, T, 2H]`` → ``[b, T, V]`` logits from the decoder-state half."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.project = _init(nn.Linear(hidden, vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.project(x[:, :, self.hidden :])
        return out


def _encoder(c: GNMTConfig) -> tuple[Layer, ...]:
    layers = [Layer("enc0", functools.partial(BidirectionalEncoderLayer, c.hidden))]
    for i in range(1, c.encoder_layers):
        inputs = 2 * c.hidden if i == 1 else c.hidden
        layers.append(Layer(f"enc{i}", functools.partial(EncoderLayer, inputs, c.hidden, i >= RESIDUAL_FROM)))
    return tuple(layers)


def _decoder(c: GNMTConfig) -> tuple[Layer, ...]:
    layers = [Layer("dec0", functools.partial(AttentionDecoderLayer, c.hidden))]
    for i in range(1, c.decoder_layers):
        layers.append(Layer(f"dec{i}", functools.partial(DecoderLayer, c.hidden, i >= RESIDUAL_FROM)))
    return tuple(layers)


def build(config: GNMTConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: ``embed``, ``enc0 … enc{E-1}``, ``dec0 … dec{D-1}``, ``head``."""
    c = config
    embed = Layer("embed", functools.partial(TokenEmbedding, c.vocab, c.hidden))
    head = Layer("head", functools.partial(Head, c.hidden, c.vocab))
    return LayerGraph(
        name=name,
        layers=(embed, *_encoder(c), *_decoder(c), head),
        input=TensorSpec((2, c.length), "int64", high=c.vocab),
        target=TensorSpec((c.length,), "int64", high=c.vocab),
        loss=LossKind.LM,
        seed=seed,
    )
