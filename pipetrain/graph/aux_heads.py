"""Auxiliary heads: the local losses of PPLL's stages (docs/algorithms.md §6).

With method ``local`` every stage but the last trains through its own head on its own output; no
gradient crosses a stage. A head *predicts the model's output* from the stage's output and scores
it with the task's loss (the job's: cross-entropy, mse, next-token or a user's callable,
:mod:`pipetrain.data.loss`), so local learning trains classifiers, regressors and language models
alike; it returns the micro-batch's *mean* local loss. The head's prediction has the shape of the
model's output ``[b, *out]`` (``out`` its last layer's per-sample output):

=================  ===========================  ==================================================
model output       stage output ``h``           the head's predictor
=================  ===========================  ==================================================
``[b, C]``         any (pooled to a vector)     classes or regression values: ``[b, *h]`` → ``[b, C]``
``[b]``            any (pooled to a vector)     one value per sample: ``[b, *h]`` → ``[b]``
``[b, T, V]``      tokens ``[b, T, D]``         per position: ``[b, T, D]`` → ``[b, T, V]``
=================  ===========================  ==================================================

Three kinds, after the local-learning papers of PPLL's authors' group (greedy supervised layer-wise
training; DGL, Belilovsky et al. 2020; InfoPro, Wang et al. 2021), reduced to tiny models (``n`` the
output's features per sample or position, ``ℓ`` the task's loss, ``y`` the target, ``x`` the input):

=========  ================================================================================
kind       what
=========  ================================================================================
linear     pool to a vector, Linear(→ n); per position: Linear(D → V); ℓ(head(h), y)
dgl        images ``[C, H, W]``: two Conv1×1(→w)+BN+ReLU, GAP, Linear(w→w)+ReLU, Linear(→ n);
           tokens ``[N, D]``: LayerNorm, mean over tokens, Linear(D→w)+GELU, Linear(→ n) (per
           position: the same without the mean); vectors ``[D]``: Linear(D→w)+ReLU, Linear(→ n);
           ℓ(head(h), y)
infopro    dgl's predictor plus, where the input is an image ``[C₀, S, S]`` and ``h`` is spatial
           (or a square grid of tokens), a decoder (bilinear upsample to S×S, Conv3×3(→w)+BN+ReLU,
           Conv3×3(→C₀)): λ_y·ℓ + λ_x(k)·MSE(decoder(h), x)
=========  ================================================================================

``w`` is :data:`AUX_WIDTH` unless :func:`build_aux_head` is given another ``width`` (the simulated
comparison with PPLL prices its authors' group's 128-wide heads, benchmarks/history/local-sim.md). InfoPro-lite
departs from InfoPro in two places: the reconstruction is MSE against the (standardised) input, not
BCE against the de-normalised image, and the weights are
λ_y = 1, λ_x(k) = 1 − 0.9·r with r = k / max(K − 2, 1) over the heads k = 0 … K − 2, so early stages
keep more of the input, as InfoPro's linear λ schedule does. Default per model
(:func:`default_aux`): ``linear`` for vector features (MLPs), ``dgl`` for images (conv nets) and
tokens (the ViT, GPT; a linear probe on early transformer tokens learns little).

Heads are seeded by the stage index alone (``graph.seed * 100_003 + 50_000 + k``), so the pipelined
runtime and the single-process emulator build the same initial heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec

__all__ = ["AUX_KINDS", "AUX_WIDTH", "AuxHead", "AuxKind", "TaskLoss", "build_aux_head", "check_aux", "default_aux"]

AuxKind = Literal["linear", "dgl", "infopro"]
AUX_KINDS: tuple[AuxKind, ...] = get_args(AuxKind)
AUX_WIDTH = 64
_HEAD_SEED = 50_000


TaskLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""The task's loss: ``(output [b, *out], target [b, *target])`` → the sum over the ``b`` samples of
each sample's loss, a 0-d tensor (:class:`pipetrain.data.Loss`, or ``loss_sum`` of a ``LossKind``)."""


class AuxHead(nn.Module):
    """A stage's local loss: ``(h [b, *hidden], y [b, *target], x [b, *in], ℓ) -> mean loss`` (0-d).

    Attributes:
        predictor: ``[b, *hidden]`` → ``[b, *out]``, the model's output shape (module docstring).
        decoder: ``[b, *hidden]`` → ``[b, *in]`` for InfoPro's reconstruction term, or None.
        reconstruction_weight: λ_x of the reconstruction term.
    """

    def __init__(self, predictor: nn.Module, decoder: nn.Module | None = None, reconstruction_weight: float = 0.0):
        super().__init__()
        self.predictor = predictor
        self.decoder = decoder
        self.reconstruction_weight = reconstruction_weight

    def forward(self, h: torch.Tensor, y: torch.Tensor, x: torch.Tensor, loss: TaskLoss) -> torch.Tensor:
        """The task's loss ``ℓ`` of the head's prediction, the mean over the micro-batch, plus InfoPro's
        reconstruction term where the head has a decoder."""
        value = loss(self.predictor(h), y) / h.shape[0]
        if self.decoder is not None:
            value = value + self.reconstruction_weight * nn.functional.mse_loss(self.decoder(h), x)
        return value


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


def check_aux(graph: LayerGraph, kind: str, cuts: Sequence[TensorSpec] = ()) -> AuxKind:
    """``kind`` as an :data:`AuxKind`, after checking that ``graph`` can train with local heads: its
    output is one a head predicts (module docstring), and so is it from every stage output in ``cuts``.

    Raises:
        UserError: an unknown kind, a model output no head predicts, or a cut no head predicts it from.
    """
    if kind not in AUX_KINDS:
        raise UserError(f"--aux {kind!r} is unknown; use one of {', '.join(AUX_KINDS)}")
    output = _predicted(graph)
    for spec in cuts:
        _check_cut(spec, output)
    return kind


def _predicted(graph: LayerGraph) -> TensorSpec:
    """The model's per-sample output, which the heads predict; a UserError where no head can."""
    output = graph.output_specs()[-1]
    if not output.torch_dtype.is_floating_point or len(output.shape) > 2:
        raise UserError(f"method local's auxiliary heads predict the model's output, [b], [b, n] or [b, T, V] "
                        f"floats, but model {graph.name!r} outputs {output.shape} {output.dtype} per sample; use "
                        "another method")
    return output


def _check_cut(spec: TensorSpec, output: TensorSpec) -> None:
    """A head predicts ``output`` from stage outputs ``spec`` (module docstring)."""
    if len(output.shape) == 2 and (len(spec.shape) != 2 or spec.shape[0] != output.shape[0]):
        raise UserError(f"a local head predicts outputs [T, V] = {output.shape} per position, from tokens "
                        f"[T, D] of the same T; a stage here outputs {spec.shape}: cut the model between its "
                        "blocks")
    if not 1 <= len(spec.shape) <= 3:
        raise UserError(f"no auxiliary head for stage outputs of shape {spec.shape}; cut the model where it passes "
                        "vectors, tokens [N, D] or images [C, H, W]")


def _per_position(kind: AuxKind, features: int, vocabulary: int, w: int) -> nn.Module:
    """``[b, T, D]`` → ``[b, T, V]``, position by position, ``w`` wide."""
    if kind == "linear":
        return nn.Linear(features, vocabulary)
    return nn.Sequential(nn.LayerNorm(features), nn.Linear(features, w), nn.GELU(), nn.Linear(w, vocabulary))


def _predictor(kind: AuxKind, spec: TensorSpec, output: TensorSpec, w: int) -> nn.Module:
    """The head's ``[b, *spec]`` → ``[b, *output]``, ``w`` wide (module docstring)."""
    _check_cut(spec, output)
    if len(output.shape) == 2:
        return _per_position(kind, spec.shape[1], output.shape[1], w)
    pooled = _pooled(kind, spec, output.shape[0] if output.shape else 1, w)
    return pooled if output.shape else nn.Sequential(pooled, nn.Flatten(0))


def _pooled(kind: AuxKind, spec: TensorSpec, n: int, w: int) -> nn.Module:
    """``[b, *spec]`` → ``[b, n]``: a vector per sample, ``w`` wide."""
    shape = spec.shape
    if len(shape) == 3:
        if kind == "linear":
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(shape[0], n))
        return nn.Sequential(nn.Conv2d(shape[0], w, 1), nn.BatchNorm2d(w), nn.ReLU(), nn.Conv2d(w, w, 1),
                             nn.BatchNorm2d(w), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(w, w), nn.ReLU(), nn.Linear(w, n))
    if len(shape) == 2:
        if kind == "linear":
            return nn.Sequential(_TokenMean(), nn.Linear(shape[1], n))
        return nn.Sequential(nn.LayerNorm(shape[1]), _TokenMean(), nn.Linear(shape[1], w), nn.GELU(), nn.Linear(w, n))
    if kind == "linear":
        return nn.Linear(shape[0], n)
    return nn.Sequential(nn.Linear(shape[0], w), nn.ReLU(), nn.Linear(w, n))


def _decoder(spec: TensorSpec, image: TensorSpec, w: int) -> nn.Module | None:
    """InfoPro's decoder ``[b, *spec]`` → ``[b, *image]``, ``w`` wide, or None where there is nothing spatial."""
    if len(image.shape) != 3:
        return None
    grid: list[nn.Module] = []
    if len(spec.shape) == 2 and math.isqrt(spec.shape[0]) ** 2 == spec.shape[0]:
        grid, channels = [_TokensToGrid()], spec.shape[1]
    elif len(spec.shape) == 3:
        channels = spec.shape[0]
    else:
        return None
    c0 = image.shape[0]
    return nn.Sequential(*grid, nn.Upsample(size=image.shape[1:], mode="bilinear", align_corners=False),
                         nn.Conv2d(channels, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(),
                         nn.Conv2d(w, c0, 3, padding=1))


def build_aux_head(kind: AuxKind, graph: LayerGraph, spec: TensorSpec, stage: int, n_stages: int,
                   width: int = AUX_WIDTH) -> AuxHead:
    """The head of ``stage`` (of ``n_stages``), on its output ``spec``, ``width`` wide (``w`` of the
    module docstring), with deterministic weights.

    Raises:
        UserError: the model's output, or the stage's output, cannot take a head (:func:`check_aux`).
    """
    output = _predicted(graph)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(graph.seed * 100_003 + _HEAD_SEED + stage)
        predictor = _predictor(kind, spec, output, width)
        decoder = _decoder(spec, graph.input, width) if kind == "infopro" else None
    ratio = stage / max(n_stages - 2, 1)
    return AuxHead(predictor, decoder, 1.0 - 0.9 * ratio)
