"""Datasets of dict items (the Hugging Face convention) as ``(input, target)`` samples.

A Hugging Face model takes keyword tensors and a dataset for it yields dicts::

    {"input_ids": [T] int64, "attention_mask": [T] int64, "labels": [T] int64}

:class:`FieldsDataset` turns each item into pipetrain's ``(input, target)`` sample: the target is
``labels``; the input is every other entry, in the item's order, packed into one tensor by
:func:`pipetrain.graph.packing.pack` (``[2T] int64`` above), whose layout the input spec's
``fields`` records, so the captured model unpacks it into the same keywords.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Field
from pipetrain.graph.packing import pack

__all__ = ["TARGET_KEY", "FieldsDataset", "fields_of"]

TARGET_KEY = "labels"
"""The entry of a dict item that is the target (Hugging Face's name)."""


def fields_of(item: Mapping[str, Any], where: str) -> tuple[Field, ...]:
    """The keyword inputs of a dict item: every tensor entry but ``labels``, in order.

    Raises:
        UserError: no ``labels``, an entry that is not a tensor, or no input.
    """
    if TARGET_KEY not in item:
        raise UserError(f"{where} yields dicts without {TARGET_KEY!r} ({', '.join(map(repr, item))}); add the "
                        f"target under {TARGET_KEY!r} (for a causal LM: the input_ids themselves)")
    bad = [key for key, value in item.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise UserError(f"{where} yields dicts whose {', '.join(map(repr, bad))} are not tensors; make every entry "
                        "a tensor (one sample, no batch dimension)")
    fields = tuple(Field(key, tuple(value.shape), str(value.dtype).removeprefix("torch."))
                   for key, value in item.items() if key != TARGET_KEY)
    if not fields:
        raise UserError(f"{where} yields dicts with only {TARGET_KEY!r}; add the model's inputs (e.g. input_ids)")
    return fields


class FieldsDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``dataset``'s dict items as ``(packed inputs, labels)``; ``fields``: the layout of the first item.

    Raises:
        UserError: (on access) an item whose keys, shapes or dtypes differ from the first.
    """

    def __init__(self, dataset: Dataset[Mapping[str, torch.Tensor]], where: str) -> None:
        self.dataset, self.where = dataset, where
        self.fields = fields_of(dataset[0], where)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.dataset[i]
        if fields_of(item, self.where) != self.fields:
            raise UserError(f"{self.where} item {i} has other keys, shapes or dtypes than item 0; give every item "
                            "the same (pad sequences to one length)")
        return pack([item[field.name].unsqueeze(0) for field in self.fields])[0], item[TARGET_KEY]
