"""Held-out evaluation: a tally of loss and accuracy over micro-batches, the same wherever it runs.

The pipeline's last stage and the single-process reference both feed every eval micro-batch's
``(output [b, ...], target [b, ...])`` to an :class:`EvalTally`; sums (not means) make the result
independent of how the eval set was cut into micro-batches::

    eval_loss     = Σ per-sample loss / samples            (the training loss, on held-out data)
    eval_accuracy = Σ correct / Σ predictions              argmax over the last dim == target (next-token
                                                          loss: the next target; targets of -100 not counted)
    perplexity    = exp(eval_loss)                         for a class per position (language models)

Accuracy is defined when the output has one more dimension than the target (the classes), and the
target is integer: ``[b, C]`` vs ``[b]`` (a class per sample), ``[b, T, V]`` vs ``[b, T]``
(next-token accuracy over all positions). Otherwise (regression) it is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipetrain.data.loss import Loss
from pipetrain.graph.layer_graph import IGNORED, LossKind

__all__ = ["EvalResult", "EvalTally"]


@dataclass(frozen=True)
class EvalResult:
    """One evaluation over the eval set.

    Attributes:
        loss: mean per-sample loss.
        accuracy: fraction of correct predictions in [0, 1]; None where it is not defined.
        samples: samples evaluated.
        per_position: the targets hold a class per position (perplexity is meaningful).
    """

    loss: float
    accuracy: float | None
    samples: int
    per_position: bool = False

    @property
    def perplexity(self) -> float | None:
        """``exp(loss)`` for language models (a class per position), else None."""
        return math.exp(min(self.loss, 700.0)) if self.per_position else None

    def describe(self) -> str:
        """``eval loss 0.1234, accuracy 96.1%`` (with perplexity for language models)."""
        text = f"eval loss {self.loss:.4f}"
        if self.accuracy is not None:
            text += f", accuracy {self.accuracy:.1%}"
        if self.perplexity is not None:
            text += f", perplexity {self.perplexity:.2f}"
        return text


class EvalTally:
    """Running sums over eval micro-batches; :meth:`totals` and :meth:`add_totals` let replicas of a
    stage (each holding part of the samples) combine their sums with one all-reduce."""

    def __init__(self) -> None:
        self.loss_sum = 0.0
        self.correct = 0.0
        self.predictions = 0.0
        self.samples = 0.0
        self.classified = True
        self.per_position = False

    def add(self, loss: Loss, output: torch.Tensor, target: torch.Tensor) -> None:
        """Add a micro-batch: ``output [b, ...]``, ``target [b, ...]``."""
        self.loss_sum += float(loss(output, target))
        self.samples += target.shape[0]
        if output.dim() == target.dim() + 1 and not target.is_floating_point():
            if loss.kind is LossKind.CAUSAL_LM:  # position t predicts target t + 1; -100 is no target
                output, target = output[:, :-1], target[:, 1:]
            counted = target != IGNORED
            self.correct += float(((output.argmax(dim=-1) == target) & counted).sum())
            self.predictions += float(counted.sum())
            self.per_position = target.dim() > 1
        else:
            self.classified = False

    def totals(self) -> torch.Tensor:
        """``[4]`` float64: loss sum, correct, predictions, samples."""
        return torch.tensor([self.loss_sum, self.correct, self.predictions, self.samples], dtype=torch.float64)

    def set_totals(self, totals: torch.Tensor) -> None:
        """Replace the sums by ``totals`` (e.g. after summing every replica's :meth:`totals`)."""
        self.loss_sum, self.correct, self.predictions, self.samples = (float(v) for v in totals)

    def result(self) -> EvalResult:
        """The evaluation so far.

        Raises:
            ValueError: nothing was added.
        """
        if self.samples == 0:
            raise ValueError("no eval samples were added")
        accuracy = self.correct / self.predictions if self.classified and self.predictions else None
        return EvalResult(self.loss_sum / self.samples, accuracy, int(self.samples), self.per_position)
