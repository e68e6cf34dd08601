"""Synthetic networks: seeded chains whose layers have very different cost curves.

The UMPIPE paper reports its largest gains (≥ 170 %) on "simulation networks" whose construction
it does not publish. docs/algorithms.md §2.2 explains where such gains come from: a stage's forward time is
roughly ``f_k(b) ≈ α_k + β_k · max(b, s_k)``, and unequal micro-batches pay off when the
per-micro-batch overhead α_k and the saturation point s_k differ a lot between stages. This family
is pipetrain's own construction of networks with exactly that property, reproducible from one
integer; it is not the paper's.

``variant`` seeds ``numpy.random.default_rng(variant)``, which draws every layer's *kind* and
sizes; the initial weights come, as for every zoo model, from the graph's ``seed``. The kinds are
balanced: each run of three layers holds one of each (so every kind occurs once there are three
layers), and the order is then shuffled. (NumPy keeps ``Generator`` streams stable in practice but
does not promise it across versions; the graph's fingerprint, which plans record, would expose a
change.) Layer ``i`` is named after its kind: ``wide{i}``, ``overhead{i}`` or ``flat{i}``. Every
layer is a pre-LayerNorm residual block mapping ``[b, inputs]`` to ``[b, inputs]``, so any
contiguous cut is a valid stage, and the last layer adds a final LayerNorm and a
``Linear(inputs → classes)`` head. Data: input ``[b, inputs]`` float32, output ``[b, classes]``
logits, target one int64 class per sample in ``[0, classes)``, scored with
``LossKind.CROSS_ENTROPY``.

The three kinds, with the ranges drawn at ``width = 1`` (d = ``inputs``, LN = LayerNorm)::

    wide      x + TokenMLP(LN(x)): viewed as T tokens of d/T features, Linear(d/T → h), GELU,
              Linear(h → d/T) on every token. T ∈ {16, 32, 64} (then gcd(T, d)); the expanded
              activation T·h is log-uniform in [2^17, 2^18] floats per sample (512 KiB to 1 MiB).
              5 kernels forward, 15 backward; 2·(d/T)·h weights, 30 k to 0.5 M.
    overhead  n residual bottlenecks x + Linear(r → d)(GELU(Linear(d → r)(LN(x)))), n ∈ [4, 12]
              uniform, rank r ∈ {4, 8, 16}: 5n kernels forward (20 to 60), 15n backward.
    flat      x + Linear(h → d)(ReLU(Linear(d → h)(LN(x)))), h log-uniform in [4096, 16384] and
              rounded to a multiple of 64: 2 to 8 M weights (8 to 32 MiB).

``width`` multiplies both kinds' ``h`` (rounded, at least 1). Why the cost curves differ, in the
per-kernel roofline of ``pipetrain.profile.estimate`` (a kernel costs ``o + max(max(f, s)/P,
m/W)``; on the ``v100`` model o = 6 µs, s/P = 2.5 µs and P/W = 100 FLOP/byte, with float32 bytes at
the fp16 tensor-core peak P, as the variants were designed; an fp32 estimate has P 8x lower and an
fp16 one half the bytes, which moves the turning points below):

* **wide** layers have small weights but move 512 KiB to 1 MiB of activations per sample in their
  heavy kernels, so memory time passes the launch overhead o at b ≈ o·W / (bytes per sample), a few
  samples, and the time then grows linearly in b: small α, small s, large β. (A token-wise Linear
  does only about d/(2T) FLOP per byte, so these kernels are memory-bound.)
* **flat** layers read 4 to 16 MiB of float32 weights per matmul whatever b is, which costs more
  than the matmul's FLOPs until b ≈ 2P/W (≈ 200 on ``v100``, ≈ 385 on ``h100``): a large α from
  weight reads and a large s, the "FC layer with big weights" of §2.2.
* **overhead** layers launch 20 to 60 kernels per forward, each moving 1 to 2 KiB per sample, so
  memory time reaches o only at thousands of samples, and their rank-r matmuls sit on the
  saturation floor s/P until b·2dr > s, tens of thousands: α is many launch overheads, β is tiny,
  and the curve stays flat far past any useful b.

Estimated on ``v100`` (default settings, variants 0-59), the forward time of b = 64 samples is 4 to
10 times that of one sample for wide layers but at most 1.3 times for flat and overhead ones, so
the per-sample efficiency 64·t(1)/t(64) varies 5.5 to 10-fold between the layers of one network
(3 to 5-fold on ``h100``, whose launch overhead buys more bandwidth). The forward time of one
sample, about α, is 35-55 µs for wide, 40-90 µs for flat and 140-440 µs for overhead layers. A
stage's best micro-batch size therefore depends strongly on which layers it holds.

The default network (8 layers, d = 256) has 6 to 21 M parameters; a forward and backward pass of
64 samples takes a few tenths of a second on two CPU cores.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = [
    "KINDS",
    "Bottlenecks",
    "DenseMLP",
    "LayerDraw",
    "SyntheticConfig",
    "TokenMLP",
    "WithHead",
    "build",
    "draw_layers",
]

KINDS: tuple[str, ...] = ("wide", "overhead", "flat")

# Ranges of the draws (at width = 1); the module docstring explains them.
WIDE_TOKENS: tuple[int, ...] = (16, 32, 64)
WIDE_EXPANDED_LOG2: tuple[float, float] = (17.0, 18.0)  # T·h floats per sample
OVERHEAD_STEPS: tuple[int, int] = (4, 12)  # inclusive
OVERHEAD_RANKS: tuple[int, ...] = (4, 8, 16)
FLAT_HIDDEN_LOG2: tuple[float, float] = (12.0, 14.0)


@dataclass(frozen=True)
class SyntheticConfig:
    """Settings of a synthetic network.

    Attributes:
        variant: seed of the generator that draws the layers' kinds and sizes; any integer >= 0
            (the only zoo setting that may be 0).
        n_layers: pipeline layers.
        inputs: features per sample, in and out of every layer (d).
        classes: output logits per sample.
        width: multiplier on the wide and flat kinds' hidden sizes (e.g. 0.25 for quick tests).
    """

    variant: int = field(default=0, metadata={"minimum": 0})
    n_layers: int = 8
    inputs: int = 256
    classes: int = 10
    width: float = 1.0

    def __post_init__(self) -> None:
        if self.variant < 0:
            raise UserError(f"synthetic: variant must be >= 0, got {self.variant}")
        if self.n_layers < 1:
            raise UserError(f"synthetic: n_layers must be >= 1, got {self.n_layers}")


@dataclass(frozen=True)
class LayerDraw:
    """One drawn layer: its kind and sizes (0 where the kind has no such size).

    Attributes:
        kind: ``"wide"``, ``"overhead"`` or ``"flat"``.
        tokens: wide: tokens per sample (T).
        hidden: wide: hidden units per token; flat: hidden units.
        steps: overhead: residual bottlenecks (n).
        rank: overhead: bottleneck width (r).
    """

    kind: str
    tokens: int = 0
    hidden: int = 0
    steps: int = 0
    rank: int = 0

    def factory(self, features: int) -> Callable[[], nn.Module]:
        """A picklable factory of this layer for ``[b, features]`` activations."""
        if self.kind == "wide":
            return functools.partial(TokenMLP, features, self.tokens, self.hidden)
        if self.kind == "overhead":
            return functools.partial(Bottlenecks, features, self.steps, self.rank)
        return functools.partial(DenseMLP, features, self.hidden)


class TokenMLP(nn.Module):
    """``x + fc2(GELU(fc1(LN(x) as [b, tokens, features/tokens])))``: ``[b, features]`` → same."""

    def __init__(self, features: int, tokens: int, hidden: int) -> None:
        super().__init__()
        if features % tokens:
            raise UserError(f"synthetic: {tokens} tokens do not divide {features} features")
        self.tokens = tokens
        self.norm = nn.LayerNorm(features)
        self.fc1 = nn.Linear(features // tokens, hidden)
        self.fc2 = nn.Linear(hidden, features // tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).reshape(x.shape[0], self.tokens, -1)
        y: torch.Tensor = self.fc2(nn.functional.gelu(self.fc1(h)))
        return x + y.reshape(x.shape)


class Bottlenecks(nn.Module):
    """``steps`` residual bottlenecks ``x + up(GELU(down(LN(x))))`` of rank ``rank``."""

    def __init__(self, features: int, steps: int, rank: int) -> None:
        super().__init__()
        self.norm = nn.ModuleList(nn.LayerNorm(features) for _ in range(steps))
        self.down = nn.ModuleList(nn.Linear(features, rank) for _ in range(steps))
        self.up = nn.ModuleList(nn.Linear(rank, features) for _ in range(steps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, down, up in zip(self.norm, self.down, self.up, strict=True):
            x = x + up(nn.functional.gelu(down(norm(x))))
        return x


class DenseMLP(nn.Module):
    """``x + fc2(ReLU(fc1(LN(x))))`` with a wide hidden layer: ``[b, features]`` → same."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.fc2(nn.functional.relu(self.fc1(self.norm(x))))
        return x + y


class WithHead(nn.Sequential):
    """A layer, a final LayerNorm and ``Linear(features → classes)``: the network's last layer."""

    def __init__(self, block: Callable[[], nn.Module], features: int, classes: int) -> None:
        super().__init__(block(), nn.LayerNorm(features), nn.Linear(features, classes))


def _log_uniform(rng: np.random.Generator, log2_range: tuple[float, float]) -> float:
    return float(2.0 ** rng.uniform(*log2_range))


def _scaled(units: float, width: float) -> int:
    return max(1, round(units * width))


def draw_layers(config: SyntheticConfig) -> tuple[LayerDraw, ...]:
    """The kinds and sizes of ``config``'s layers, drawn from ``default_rng(config.variant)``."""
    rng = np.random.default_rng(config.variant)
    n = config.n_layers
    rounds = -(-n // len(KINDS))
    slots = np.concatenate([rng.permutation(len(KINDS)) for _ in range(rounds)])[:n]
    kinds = [KINDS[int(k)] for k in rng.permutation(slots)]
    draws = []
    for kind in kinds:
        # Every kind consumes the same draws, so one layer's kind does not shift the others' sizes.
        token_choice = int(rng.integers(0, len(WIDE_TOKENS)))
        expanded = _log_uniform(rng, WIDE_EXPANDED_LOG2)
        steps = int(rng.integers(OVERHEAD_STEPS[0], OVERHEAD_STEPS[1] + 1))
        rank = OVERHEAD_RANKS[int(rng.integers(0, len(OVERHEAD_RANKS)))]
        flat_hidden = 64 * round(_log_uniform(rng, FLAT_HIDDEN_LOG2) / 64)
        if kind == "wide":
            tokens = math.gcd(WIDE_TOKENS[token_choice], config.inputs)
            draws.append(LayerDraw(kind, tokens=tokens, hidden=_scaled(expanded / tokens, config.width)))
        elif kind == "overhead":
            draws.append(LayerDraw(kind, steps=steps, rank=rank))
        else:
            draws.append(LayerDraw(kind, hidden=_scaled(flat_hidden, config.width)))
    return tuple(draws)


def build(config: SyntheticConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: layers named ``{kind}{i}``, e.g. ``wide0, flat1, …``."""
    d = config.inputs
    layers = []
    draws = draw_layers(config)
    for i, draw in enumerate(draws):
        factory = draw.factory(d)
        if i == len(draws) - 1:
            factory = functools.partial(WithHead, factory, d, config.classes)
        layers.append(Layer(f"{draw.kind}{i}", factory))
    return LayerGraph(
        name=name,
        layers=tuple(layers),
        input=TensorSpec((d,)),
        target=TensorSpec((), "int64", high=config.classes),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
