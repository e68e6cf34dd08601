"""The real-models benchmark's models, unchanged, and their data (issue 26).

transformers' ``GPT2LMHeadModel`` (6 blocks, width 256, 4 heads, vocabulary 2,048, context 128,
dropout 0, head tied to the token embedding; random init) on synthetic token windows given as
Hugging Face dicts (``input_ids``, ``labels``), trained on the next-token loss; and torchvision's
ResNet-18 structure (``tests.vision_models.resnet18``: torchvision itself does not import here) at
64×64 with 10 classes on synthetic images, on cross-entropy. Every side of the benchmark trains on
the same batches: pipetrain's step-indexed sampling of the same datasets (:meth:`RealModel.batch_at`).

pipetrain's ranks load the data by name (``common.real_models:gpt2_data``): the spawned ranks
inherit the benchmark's ``sys.path``, which holds ``benchmarks/``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from pipetrain.data import StepLoader
from pipetrain.graph.layer_graph import LossKind, loss_sum

__all__ = ["CLASSES", "CONTEXT", "IMAGE", "LR", "MODELS", "SEED", "VOCAB", "RealModel", "TokenWindows", "build_gpt2",
           "build_resnet18", "gpt2_data", "resnet18_data"]

SEED = 0
LR = 0.01
VOCAB, CONTEXT = 2048, 128
IMAGE, CLASSES = (3, 64, 64), 10
TRAIN_SAMPLES, EVAL_SAMPLES = 512, 64


def build_gpt2(use_cache: bool = False) -> nn.Module:
    """transformers' GPT-2 of 6 blocks, width 256, 4 heads, random init (about 5.3 M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, use_cache=use_cache)
    return GPT2LMHeadModel(config)


def build_resnet18() -> nn.Module:
    """torchvision's ResNet-18 structure with 10 classes (about 11.2 M parameters)."""
    root = str(Path(__file__).resolve().parents[2])  # the repository, for tests.vision_models
    if root not in sys.path:
        sys.path.append(root)
    from tests.vision_models import resnet18

    return resnet18(CLASSES)


class TokenWindows(Dataset[dict[str, torch.Tensor]]):
    """Rows of ``tokens`` as Hugging Face samples: ``{"input_ids": [T], "labels": [T]}`` (the model shifts)."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


@cache
def _tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, VOCAB, (TRAIN_SAMPLES + EVAL_SAMPLES, CONTEXT), generator=generator)


@cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    n = TRAIN_SAMPLES + EVAL_SAMPLES
    return torch.randn(n, *IMAGE, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator)


def gpt2_data() -> tuple[TokenWindows, TokenWindows]:
    """Train and eval token windows (``--data common.real_models:gpt2_data``)."""
    tokens = _tokens()
    return TokenWindows(tokens[:TRAIN_SAMPLES]), TokenWindows(tokens[TRAIN_SAMPLES:])


def resnet18_data() -> tuple[TensorDataset, TensorDataset]:
    """Train and eval ``(image [3, 64, 64], class)`` samples."""
    x, y = _images()
    return TensorDataset(x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES]), TensorDataset(x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:])


@dataclass(frozen=True)
class RealModel:
    """One benchmarked model: how to build it, its data (a pipetrain source) and batch."""

    name: str
    title: str
    batch: int
    data: str
    keyword: str | None  # the model's input keyword (Hugging Face), or None: one positional input
    build: Callable[[], nn.Module]

    @property
    def loss_kind(self) -> LossKind:
        return LossKind.CAUSAL_LM if self.keyword else LossKind.CROSS_ENTROPY

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of step ``step``: the rows pipetrain's loader takes (same seed)."""
        rows = StepLoader(range(TRAIN_SAMPLES), self.batch, SEED).rows(step)  # type: ignore[arg-type]
        if self.keyword:
            tokens = _tokens()[rows]
            return tokens, tokens
        x, y = _images()
        return x[rows], y[rows]

    def call(self, inputs: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """The model's ``(args, kwargs)`` for ``inputs``."""
        return ((), {self.keyword: inputs}) if self.keyword else ((inputs,), {})

    def loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The loss summed over samples / batch, on the logits of ``output`` (a tensor, tuple or ModelOutput)."""
        logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
        logits = output[0] if logits is None else logits
        return loss_sum(self.loss_kind, logits, target) / self.batch


MODELS: dict[str, RealModel] = {
    "gpt2": RealModel("gpt2", "GPT-2", 16, "common.real_models:gpt2_data", "input_ids", build_gpt2),
    "resnet18": RealModel("resnet18", "ResNet-18 64×64", 32, "common.real_models:resnet18_data", None,
                          build_resnet18),
}
