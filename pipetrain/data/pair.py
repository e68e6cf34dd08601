"""The value a data source produces: a train and an eval dataset of ``(input, target)`` samples.

Both are map-style ``torch.utils.data.Dataset`` s (``len`` and ``dataset[i]``); item ``i`` is one
sample without the batch dimension, e.g. for ``mlp-digits`` ``(x [64] float32, y [] int64)`` and for
``gpt-tiny`` on ``text`` ``(tokens [32] int64, next_tokens [32] int64)``. :func:`check_pair` checks
a pair against the model before any rank starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch.utils.data import Dataset, TensorDataset

from pipetrain.data.fields import FieldsDataset
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Field, TensorSpec

__all__ = ["DatasetPair", "Sample", "check_pair", "sample_spec", "tensor_pairs"]

Sample = tuple[torch.Tensor, torch.Tensor]
"""One ``(input, target)`` sample, without the batch dimension."""


@dataclass(frozen=True)
class DatasetPair:
    """A source's two datasets.

    Attributes:
        train: the samples training draws mini-batches from (shuffled per epoch).
        eval: held-out samples, never trained on.
    """

    train: Dataset[Sample]
    eval: Dataset[Sample]


def tensor_pairs(inputs: torch.Tensor, targets: torch.Tensor) -> Dataset[Sample]:
    """A ``TensorDataset``: item ``i`` is ``(inputs[i], targets[i])`` of ``inputs [N, ...]``, ``targets [N, ...]``."""
    return cast("Dataset[Sample]", TensorDataset(inputs, targets))


def check_pair(pair: object, source: str, model: str, input_spec: TensorSpec | None) -> DatasetPair:
    """``pair`` as a :class:`DatasetPair`, after checking its shape against the model.

    Accepts a ``DatasetPair`` or a ``(train, eval)`` tuple; each dataset must have a length >= 1 and
    yield ``(input, target)`` tensors whose input matches ``input_spec`` (shape and dtype; None: any).

    Raises:
        UserError: one line naming the source, what it returned and what the model expects.
    """
    if isinstance(pair, tuple | list) and len(pair) == 2:
        pair = DatasetPair(pair[0], pair[1])
    if not isinstance(pair, DatasetPair):
        raise UserError(
            f"data {source!r} returned a {type(pair).__name__}; return a (train_dataset, eval_dataset) tuple "
            "of map-style torch Datasets"
        )
    splits = []
    for split, dataset in (("train", pair.train), ("eval", pair.eval)):
        where = f"data {source!r} ({split} split)"
        dataset = _samples(dataset, where)
        _check_dataset(dataset, where, model, input_spec)
        splits.append(dataset)
    return DatasetPair(splits[0], splits[1])


def sample_spec(dataset: Dataset[Sample]) -> tuple[TensorSpec, TensorSpec]:
    """Per-sample ``(input, target)`` specs of a checked dataset's first item (with the keyword
    inputs' layout, ``fields``, for a dataset of dict items)."""
    x, y = dataset[0]
    spec = TensorSpec.of(x.unsqueeze(0))
    if isinstance(dataset, FieldsDataset):
        spec = replace(spec, fields=dataset.fields)
    return spec, TensorSpec.of(y.unsqueeze(0))


def _samples(dataset: object, where: str) -> Any:
    """``dataset``, or for one of dict items (Hugging Face style) its :class:`FieldsDataset`."""
    if isinstance(dataset, Sized) and hasattr(dataset, "__getitem__") and len(dataset) >= 1:
        if isinstance(dataset[0], Mapping):  # type: ignore[index]
            return FieldsDataset(dataset, where)  # type: ignore[arg-type]
    return dataset


def _check_dataset(dataset: object, where: str, model: str, input_spec: TensorSpec | None) -> None:
    if not (isinstance(dataset, Sized) and hasattr(dataset, "__getitem__")):
        raise UserError(f"{where} is a {type(dataset).__name__}; give a map-style torch Dataset (len and [i])")
    if len(dataset) < 1:
        raise UserError(f"{where} is empty; give it at least one sample")
    item: Any = dataset[0]  # type: ignore[index]
    if not (isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(t, torch.Tensor) for t in item)):
        raise UserError(f"{where} yields {_describe(item)}; make dataset[i] return an (input, target) pair of tensors, "
                        "or a dict of tensors with the target under 'labels'")
    x = item[0]
    fields = getattr(dataset, "fields", ())
    if input_spec is not None and fields and input_spec.fields and fields != input_spec.fields:
        raise UserError(f"{where} yields the inputs {_layout(fields)}, but model {model!r} takes "
                        f"{_layout(input_spec.fields)}; make the data match the model or choose another model")
    if input_spec is not None and (tuple(x.shape) != input_spec.shape or x.dtype != input_spec.torch_dtype):
        raise UserError(
            f"{where} yields inputs of shape {tuple(x.shape)} {_dtype(x.dtype)}, but model {model!r} takes "
            f"{input_spec.shape} {input_spec.dtype} per sample; make the data match the model or choose another model"
        )


def _layout(fields: tuple[Field, ...]) -> str:
    if not fields:
        return "one tensor"
    return ", ".join(f"{f.name} {f.shape} {f.dtype}" for f in fields)


def _describe(item: object) -> str:
    if isinstance(item, tuple | list):
        return f"a {type(item).__name__} of {len(item)} ({', '.join(type(t).__name__ for t in item)})"
    return f"a {type(item).__name__}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
