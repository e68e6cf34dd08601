"""Tied weights: one parameter (or persistent buffer) that several layers of a model hold.

GPT-2, BERT, T5 and most small language models use the token embedding's matrix as the output
head's weight (``lm_head.weight is transformer.wte.weight``). Cut into layers, the embedding and
the head are two layers, perhaps on two stages, and each layer is built on its own (a copy per
layer, :meth:`~pipetrain.graph.layer_graph.LayerGraph.build_layer`), so each gets its own copy of
the tensor, with the same value. A graph lists such tensors as :class:`Tie` s (found by
:func:`find_ties` while the layers still share the one object), and then:

* a module that assembles several layers (a stage, the single-process reference) makes their
  copies one tensor again (:func:`retie`), so a stage holding every user trains it as the model does;
* stages on different ranks keep a copy each and sum the copies' gradients before the step
  (:mod:`pipetrain.runtime.interp.ties`), so every copy takes the same step;
* checkpoints save it once, under its first name (:attr:`Tie.name`); returned and exported weights
  list it under every name with one tensor, as the model's own ``state_dict`` does, so the model
  loads them with ``strict=True`` and ``torch.save`` writes the tensor once.

    >>> model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))     # doctest: +SKIP
    >>> model[1].weight = model[0].weight                                             # doctest: +SKIP
    >>> LayerGraph.from_sequential(model, input=..., target=..., loss=...).ties       # doctest: +SKIP
    (Tie(names=('0.weight', '1.weight'), layers=('0', '1')),)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

__all__ = ["NamedLayer", "Tie", "alias_names", "find_ties", "retie", "saved_by", "saved_name"]


class NamedLayer(Protocol):
    """What this module needs of a layer (:class:`~pipetrain.graph.layer_graph.Layer`)."""

    @property
    def name(self) -> str: ...

    def qualified(self, local: str) -> str: ...


@dataclass(frozen=True)
class Tie:
    """One tensor that several layers hold.

    Attributes:
        names: the model's names of the tensor (``Layer.qualified``), in layer order, each once;
            the first is the one a checkpoint saves it under.
        layers: the names of the layers holding it, in graph order (two or more).
    """

    names: tuple[str, ...]
    layers: tuple[str, ...]

    @property
    def name(self) -> str:
        """The name the tensor is saved under (its first)."""
        return self.names[0]


def find_ties(layers: Sequence[tuple[NamedLayer, nn.Module]]) -> tuple[Tie, ...]:
    """The tensors that two or more of ``layers`` hold: one object among the values of their modules'
    ``state_dict(keep_vars=True)`` (parameters and persistent buffers), as the layers of a tied model
    hold them before each is copied. In the order the layers first name them."""
    names: dict[int, list[str]] = {}
    holders: dict[int, list[str]] = {}
    for layer, module in layers:
        for key, tensor in module.state_dict(keep_vars=True).items():
            for found, value in ((names, layer.qualified(key)), (holders, layer.name)):
                seen = found.setdefault(id(tensor), [])
                if value not in seen:
                    seen.append(value)
    return tuple(Tie(tuple(names[k]), tuple(held)) for k, held in holders.items() if len(held) > 1)


def retie(layers: Sequence[tuple[NamedLayer, nn.Module]], ties: Sequence[Tie]) -> None:
    """Make the copies of each tied tensor among ``layers`` (built one by one) one tensor, in place:
    every holder after the first takes the first one's object, so the module assembled from them
    holds, trains and counts it once."""
    for tie in ties:
        first: torch.Tensor | None = None
        for layer, module in layers:
            if layer.name not in tie.layers:
                continue
            for key, tensor in module.state_dict(keep_vars=True).items():
                if layer.qualified(key) not in tie.names:
                    continue
                if first is None:
                    first = tensor
                elif tensor is not first:
                    path, _, attribute = key.rpartition(".")
                    setattr(module.get_submodule(path), attribute, first)  # a Parameter replaces, a buffer too


def saved_name(name: str, ties: Sequence[Tie]) -> str:
    """The name a checkpoint holds model tensor ``name`` under: its tie's first name, if it is tied."""
    return next((tie.name for tie in ties if name in tie.names), name)


def saved_by(layer: str, name: str, ties: Sequence[Tie]) -> bool:
    """Whether layer ``layer`` saves its tensor ``name`` (a model name): an untied one always, a tied
    one only under the tie's first name and in its first layer, so a checkpoint holds it once."""
    tie = next((tie for tie in ties if name in tie.names), None)
    return tie is None or (name == tie.name and layer == tie.layers[0])


def alias_names(state: Mapping[str, torch.Tensor], ties: Sequence[Tie]) -> dict[str, torch.Tensor]:
    """``state`` with every name of each tie it holds mapped to one tensor (the first name's, else
    the first one found): the model's own ``state_dict`` keys, for ``load_state_dict(strict=True)``.

    Raises:
        RuntimeError: two names of one tie hold different values (their gradients were not summed).
    """
    out = dict(state)
    for tie in ties:
        held = [name for name in tie.names if name in state]
        if not held:
            continue
        value = state[held[0]]
        unequal = [name for name in held[1:] if not torch.equal(state[name], value)]
        if unequal:
            raise RuntimeError(f"the copies of tied {tie.name} differ from {unequal[0]} after training: "
                               "their gradient all-reduce failed")
        out.update(dict.fromkeys(tie.names, value))
    return out
