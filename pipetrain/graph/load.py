"""A model by reference: a zoo name, or ``module.path:callable`` returning the user's ``nn.Module``.

    >>> graph = load_model("gpt-tiny", input=None, target=None, loss=None)          # the zoo
    >>> graph = load_model("my_model:build", input=TensorSpec((64,)),                # doctest: +SKIP
    ...                    target=TensorSpec((), "int64", high=10), loss=None)

A user's module is imported from the working directory first, then ``sys.path``
(:func:`~pipetrain.callables.load_callable`), called with no arguments, and captured with torch.fx
(:func:`~pipetrain.graph.capture.capture`). The graph is named by the reference itself, so a plan
that names its model rebuilds it in every rank and in a later run.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace

from torch import nn

from pipetrain.callables import is_callable_ref, load_callable
from pipetrain.errors import UserError
from pipetrain.graph.capture import capture
from pipetrain.graph.export_capture import capture_exported
from pipetrain.graph.layer_graph import Field, LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo import build_model

__all__ = ["capture_module", "default_loss_kind", "leaf_classes", "load_model"]


def load_model(
    ref: str,
    *,
    input: TensorSpec | None,
    target: TensorSpec | None,
    loss: LossKind | None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
) -> LayerGraph:
    """The LayerGraph ``ref`` names.

    Args:
        ref: a zoo name (:data:`~pipetrain.graph.zoo.MODEL_NAMES`; the specs, loss and leaves are
            then ignored) or ``module.path:callable``, a zero-argument factory of an ``nn.Module``.
        input, target: per-sample specs of the data, needed to capture a user's module.
        loss: the loss kind; None: :func:`default_loss_kind` of ``target``.
        leaf_modules: module classes to keep whole, or their ``module.path:Class`` references.

    Raises:
        UserError: an unknown zoo name, a factory that cannot be imported, raises or returns no
            module, a user's module without specs, or one that cannot be captured.
    """
    if not is_callable_ref(ref):
        try:
            return build_model(ref)
        except UserError as error:
            raise UserError(f"{error}; or name your own nn.Module factory as module.path:callable") from None
    factory = load_callable(ref, "model")
    try:
        module = factory()
    except Exception as error:
        what = " ".join(str(error).split())
        raise UserError(f"model {ref!r} raised {type(error).__name__}: {what}; fix the factory") from error
    if not isinstance(module, nn.Module):
        raise UserError(f"model {ref!r} returned a {type(module).__name__}; make it return an nn.Module")
    if input is None or target is None:
        raise UserError(f"model {ref!r} is your own module, whose input and target shapes come from the data; "
                        "pass --data digits or --data module.path:callable")
    kind = default_loss_kind(target, input) if loss is None else loss
    return capture_module(module, input=input, target=target, loss=kind, name=ref, leaf_modules=leaf_modules)


def capture_module(module: nn.Module, *, input: TensorSpec, target: TensorSpec, loss: LossKind, name: str,
                   leaf_modules: Sequence[type[nn.Module] | str] = ()) -> LayerGraph:
    """``module`` captured by the tool that fits it: ``torch.export``
    (:func:`~pipetrain.graph.export_capture.capture_exported`) for a model of keyword inputs (dict
    data, ``input.fields``; Hugging Face), else ``torch.fx`` (:func:`~pipetrain.graph.capture.capture`).
    A model of one tensor fed dict data of one field (``text:PATH`` for your own LM) takes it as that tensor;
    a model of keyword inputs fed one tensor (tensor pairs, ``--data text``) takes it as its first input.

    Raises:
        UserError: ``leaf_modules`` with a model of keyword inputs (export keeps no module whole), or
            a capture failure.
    """
    if not input.fields and _keyword_model(module):  # a Hugging Face model fed one tensor: its first input
        first = next(iter(inspect.signature(module.forward).parameters))
        input = replace(input, fields=(Field(first, input.shape, input.dtype),))
    if input.fields and not (len(input.fields) == 1 and _one_tensor_model(module, input.fields[0].name)):
        if leaf_modules:
            raise UserError(f"model {name!r} takes keyword inputs and is captured with torch.export, which keeps no "
                            "module whole; drop --leaf")
        return capture_exported(module, input=input, target=target, loss=loss, name=name)
    plain = replace(input, fields=())
    return capture(module, input=plain, target=target, loss=loss, name=name, leaf_modules=leaf_classes(leaf_modules))


def _keyword_model(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes inputs but requires none (every one has a default: Hugging Face)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return bool(params) and all(p.default is not inspect.Parameter.empty for p in params)


def _one_tensor_model(module: nn.Module, keyword: str) -> bool:
    """Whether ``module.forward`` takes no input called ``keyword`` (so it takes one positional tensor)."""
    return keyword not in inspect.signature(module.forward).parameters


def default_loss_kind(target: TensorSpec, input: TensorSpec | None = None) -> LossKind:
    """The loss a target fits: MSE for float targets; for token targets ``(T,)`` of a model of
    keyword inputs (Hugging Face ``labels``) the next-token loss (``CAUSAL_LM``); else cross-entropy
    over a class per sample (target ``()``) or per position (``LM``, target ``(T,)``)."""
    if target.torch_dtype.is_floating_point:
        return LossKind.MSE
    if target.shape == ():
        return LossKind.CROSS_ENTROPY
    return LossKind.CAUSAL_LM if input is not None and input.fields else LossKind.LM


def leaf_classes(leaves: Sequence[type[nn.Module] | str]) -> list[type[nn.Module]]:
    """Leaf module classes, each imported if given as ``module.path:Class``.

    Raises:
        UserError: a reference that cannot be imported, or names no ``nn.Module`` class.
    """
    found = [load_callable(leaf, "leaf module") if isinstance(leaf, str) else leaf for leaf in leaves]
    for leaf, cls in zip(leaves, found, strict=True):
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise UserError(f"leaf module {leaf!r} is not an nn.Module class; name a class, e.g. my_model:Block")
    return found  # type: ignore[return-value]
