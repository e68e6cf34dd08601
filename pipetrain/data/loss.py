"""Losses by name: ``cross-entropy``, ``next-token``, ``mse`` or a user's ``module.path:callable``.

A loss maps a micro-batch's ``(output [b, ...], target [b, ...])`` to the **sum over its samples**
of each sample's loss, a scalar tensor. The runtime divides by the batch size ``B`` once, so the
gradients equal single-process training whatever the micro-batching (docs/architecture.md §5.2). A user's
callable must keep that convention: return ``per_sample_losses.sum()``, not the mean::

    def focal(output: Tensor, target: Tensor) -> Tensor:    # output [b, C], target [b] int64
        p = output.softmax(-1).gather(1, target[:, None]).squeeze(1)
        return (-(1 - p) ** 2 * p.log()).sum()

Built-in names resolve by the per-sample target spec: ``cross-entropy`` takes int64 targets of
shape ``()`` (class per sample, output ``[b, C]``) or ``(T,)`` (class per position, output
``[b, T, V]``, per-sample loss = mean over positions); ``mse`` takes float targets shaped like the
output (per-sample loss = mean over elements); ``next-token`` takes int64 targets ``(T,)`` equal to
the inputs (Hugging Face ``labels``: position ``t`` predicts target ``t + 1``, ``-100`` ignored,
per-sample loss = mean over the counted positions; a causal LM's own ``loss`` when every sample
counts as many). With no name, integer targets get cross-entropy and float targets mse, which is
each zoo model's own ``LayerGraph.loss``; a model of keyword inputs (dict data) with targets ``(T,)``
gets next-token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipetrain.callables import is_callable_ref, load_callable
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LossKind, TensorSpec, loss_sum

__all__ = ["LOSS_NAMES", "Loss", "default_loss_name", "model_loss", "resolve_loss"]

LOSS_NAMES = ("cross-entropy", "next-token", "mse")
_NAMES = {LossKind.MSE: "mse", LossKind.CAUSAL_LM: "next-token"}


@dataclass(frozen=True)
class Loss:
    """A resolved loss; picklable (a user's callable is re-imported by name in each rank).

    Attributes:
        name: ``"cross-entropy"``, ``"mse"`` or ``"module.path:callable"``.
        kind: the built-in :class:`LossKind` it computes, None for a user's callable.
    """

    name: str
    kind: LossKind | None

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The sum over the ``b`` samples of each sample's loss: a scalar tensor."""
        if self.kind is not None:
            return loss_sum(self.kind, output, target)
        value = _user_loss(self.name)(output, target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise UserError(f"loss {self.name!r} returned {got}; return a scalar tensor, the sum over samples")
        return value


def model_loss(kind: LossKind) -> Loss:
    """A model's own loss (``LayerGraph.loss``) as a :class:`Loss`."""
    return Loss(_NAMES.get(kind, "cross-entropy"), kind)


def default_loss_name(target: TensorSpec, input: TensorSpec | None = None) -> str:
    """``"mse"`` for float targets; ``"next-token"`` for token targets ``(T,)`` of a model of keyword
    inputs (``input.fields``: Hugging Face ``labels``); else ``"cross-entropy"``."""
    if target.torch_dtype.is_floating_point:
        return "mse"
    return "next-token" if input is not None and input.fields and len(target.shape) == 1 else "cross-entropy"


def resolve_loss(name: str | None, target: TensorSpec, input: TensorSpec | None = None) -> Loss:
    """The loss called ``name`` (None: the default for ``target``), checked against the target spec.

    Args:
        name: ``"cross-entropy"``, ``"mse"``, ``"module.path:callable"`` or None.
        target: the per-sample target spec the data yields.
        input: the per-sample input spec, which picks the default (:func:`default_loss_name`).

    Raises:
        UserError: an unknown name, a built-in loss that does not fit the targets, or a callable
            that cannot be imported.
    """
    name = default_loss_name(target, input) if name is None else name
    if name == "cross-entropy":
        return Loss(name, _cross_entropy_kind(target))
    if name == "next-token":
        if target.torch_dtype.is_floating_point or len(target.shape) != 1:
            raise UserError(f"loss 'next-token' takes int64 token targets (T,), not {target.shape} {target.dtype}; "
                            "use cross-entropy or mse")
        return Loss(name, LossKind.CAUSAL_LM)
    if name == "mse":
        if not target.torch_dtype.is_floating_point:
            raise UserError(f"loss 'mse' needs float targets but the data's are {target.dtype}; use cross-entropy")
        return Loss(name, LossKind.MSE)
    if is_callable_ref(name):
        _user_loss(name)
        return Loss(name, None)
    raise UserError(f"loss {name!r} is unknown; use {', '.join(LOSS_NAMES)} or module.path:callable")


def _cross_entropy_kind(target: TensorSpec) -> LossKind:
    if target.torch_dtype.is_floating_point:
        raise UserError(f"loss 'cross-entropy' needs int64 class targets but the data's are {target.dtype}; use mse")
    if target.shape == ():
        return LossKind.CROSS_ENTROPY
    if len(target.shape) == 1:
        return LossKind.LM
    raise UserError(
        f"loss 'cross-entropy' takes a class per sample or per position (target shape () or (T,)), not "
        f"{target.shape}; write a module.path:callable loss"
    )


@functools.lru_cache(maxsize=8)
def _user_loss(ref: str) -> Callable[[torch.Tensor, torch.Tensor], object]:
    return load_callable(ref, "loss")
