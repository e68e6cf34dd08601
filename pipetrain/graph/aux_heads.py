"""Auxiliary heads: the local losses of PPLL's stages (docs/algorithms.md §6).

With method ``local`` every stage but the last trains through its own head on its own output; no
gradient crosses a stage. A head is built from the stage's per-sample output spec and returns the
micro-batch's *mean* local loss. Three kinds, after the local-learning papers of PPLL's authors'
group (greedy supervised layer-wise training; DGL, Belilovsky et al. 2020; InfoPro, Wang et al.
2021), reduced to tiny models:

=========  ================================================================================
kind       what (``h`` the stage's output, ``y`` the class, ``x`` the model's input)
=========  ================================================================================
linear     pool to a vector, Linear(→ classes); CE(head(h), y)
dgl        images ``[C, H, W]``: two Conv1×1(→w)+BN+ReLU, GAP, Linear(w→w)+ReLU, Linear(→ classes);
           tokens ``[N, D]``: LayerNorm, mean over tokens, Linear(D→w)+GELU, Linear(→ classes);
           vectors ``[D]``: Linear(D→w)+ReLU, Linear(→ classes); CE(head(h), y)
infopro    dgl's classifier plus, where the input is an image ``[C₀, S, S]`` and ``h`` is spatial
           (or a square grid of tokens), a decoder (bilinear upsample to S×S, Conv3×3(→w)+BN+ReLU,
           Conv3×3(→C₀)): λ_y·CE + λ_x(k)·MSE(decoder(h), x)
=========  ================================================================================

``w`` is :data:`AUX_WIDTH`. InfoPro-lite departs from InfoPro in two places: the reconstruction is
MSE against the (standardised) input, not BCE against the de-normalised image, and the weights are
λ_y = 1, λ_x(k) = 1 − 0.9·r with r = k / max(K − 2, 1) over the heads k = 0 … K − 2, so early stages
keep more of the input, as InfoPro's linear λ schedule does. Default per model
(:func:`default_aux`): ``linear`` for vector features (MLPs), ``dgl`` for images (conv nets) and
tokens (the ViT; a linear probe on early transformer tokens learns little).

Heads are seeded by the stage index alone (``graph.seed * 100_003 + 50_000 + k``), so the pipelined
runtime and the single-process emulator build the same initial heads.
"""

from __future__ import annotations

import math
from typing import Literal, cast, get_args

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec

__all__ = ["AUX_KINDS", "AUX_WIDTH", "AuxHead", "AuxKind", "build_aux_head", "check_aux", "default_aux"]

AuxKind = Literal["linear", "dgl", "infopro"]
AUX_KINDS: tuple[AuxKind, ...] = get_args(AuxKind)
AUX_WIDTH = 64
_HEAD_SEED = 50_000


class AuxHead(nn.Module):
    """A stage's local loss: ``(h [b, *out], y [b], x [b, *in]) -> mean loss`` (0-d tensor).

    Attributes:
        classifier: ``[b, *out]`` → ``[b, classes]``.
        decoder: ``[b, *out]`` → ``[b, *in]`` for InfoPro's reconstruction term, or None.
        reconstruction_weight: λ_x of the reconstruction term.
    """

    def __init__(self, classifier: nn.Module, decoder: nn.Module | None = None, reconstruction_weight: float = 0.0):
        super().__init__()
        self.classifier = classifier
        self.decoder = decoder
        self.reconstruction_weight = reconstruction_weight

    def forward(self, h: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = nn.functional.cross_entropy(self.classifier(h), y)
        if self.decoder is not None:
            loss = loss + self.reconstruction_weight * nn.functional.mse_loss(self.decoder(h), x)
        return loss


class _TokenMean(nn.Module):
    """``[b, N, D]`` → ``[b, D]``: the mean over tokens."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.mean(dim=1)


class _TokensToGrid(nn.Module):
    """``[b, N, D]`` → ``[b, D, s, s]`` for ``N = s²`` tokens in row-major patch order."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        side = math.isqrt(h.shape[1])
        return h.transpose(1, 2).reshape(h.shape[0], h.shape[2], side, side)


def default_aux(graph: LayerGraph) -> AuxKind:
    """``linear`` for a model whose stages pass vectors (MLPs), else ``dgl`` (conv nets, ViTs)."""
    inner = graph.output_specs()[:-1]
    return "linear" if all(len(s.shape) == 1 for s in inner) else "dgl"


def check_aux(graph: LayerGraph, kind: str) -> AuxKind:
    """``kind`` as an :data:`AuxKind`, after checking that ``graph`` can train with local heads.

    Raises:
        UserError: an unknown kind, or a model whose target is not one class per sample.
    """
    if kind not in AUX_KINDS:
        raise UserError(f"--aux {kind!r} is unknown; use one of {', '.join(AUX_KINDS)}")
    target = graph.target
    if target.shape != () or target.dtype != "int64" or target.high is None:
        raise UserError(f"method local trains auxiliary classifiers, but model {graph.name!r} has targets "
                        f"{target.shape} {target.dtype}; use a model with one class per sample, or another method")
    return kind


def _classifier(kind: AuxKind, spec: TensorSpec, classes: int) -> nn.Module:
    shape, w = spec.shape, AUX_WIDTH
    if len(shape) == 3:
        if kind == "linear":
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(shape[0], classes))
        return nn.Sequential(nn.Conv2d(shape[0], w, 1), nn.BatchNorm2d(w), nn.ReLU(), nn.Conv2d(w, w, 1),
                             nn.BatchNorm2d(w), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(w, w), nn.ReLU(), nn.Linear(w, classes))
    if len(shape) == 2:
        if kind == "linear":
            return nn.Sequential(_TokenMean(), nn.Linear(shape[1], classes))
        return nn.Sequential(nn.LayerNorm(shape[1]), _TokenMean(), nn.Linear(shape[1], w), nn.GELU(),
                             nn.Linear(w, classes))
    if len(shape) == 1:
        if kind == "linear":
            return nn.Linear(shape[0], classes)
        return nn.Sequential(nn.Linear(shape[0], w), nn.ReLU(), nn.Linear(w, classes))
    raise UserError(f"no auxiliary head for stage outputs of shape {shape}; cut the model where it passes "
                    "vectors, tokens [N, D] or images [C, H, W]")


def _decoder(spec: TensorSpec, image: TensorSpec) -> nn.Module | None:
    """InfoPro's decoder ``[b, *spec]`` → ``[b, *image]``, or None where there is nothing spatial."""
    if len(image.shape) != 3:
        return None
    grid: list[nn.Module] = []
    if len(spec.shape) == 2 and math.isqrt(spec.shape[0]) ** 2 == spec.shape[0]:
        grid, channels = [_TokensToGrid()], spec.shape[1]
    elif len(spec.shape) == 3:
        channels = spec.shape[0]
    else:
        return None
    c0, w = image.shape[0], AUX_WIDTH
    return nn.Sequential(*grid, nn.Upsample(size=image.shape[1:], mode="bilinear", align_corners=False),
                         nn.Conv2d(channels, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
                         nn.Conv2d(w, c0, 3, padding=1))


def build_aux_head(kind: AuxKind, graph: LayerGraph, spec: TensorSpec, stage: int, n_stages: int) -> AuxHead:
    """The head of ``stage`` (of ``n_stages``), on its output ``spec``, with deterministic weights.

    Raises:
        UserError: the model's targets or the stage's output cannot take a head (:func:`check_aux`).
    """
    check_aux(graph, kind)
    classes = cast("int", graph.target.high)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(graph.seed * 100_003 + _HEAD_SEED + stage)
        classifier = _classifier(kind, spec, classes)
        decoder = _decoder(spec, graph.input) if kind == "infopro" else None
    ratio = stage / max(n_stages - 2, 1)
    return AuxHead(classifier, decoder, 1.0 - 0.9 * ratio)
