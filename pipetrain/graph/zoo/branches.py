"""Building blocks of the branchy (DAG) zoo models: merge layers, feed-forward layers, and a builder.

The branchy families (``mmt``, ``candle_uno``, ``dlrm``, ``branchy_digits``) follow the DAG contract
of :class:`~pipetrain.graph.layer_graph.LayerGraph`: layers in a topological order, the last layer
the only sink, a *source* layer (no incoming edge) called on the model input ``[b, *input.shape]``,
any other layer called as ``module(*inputs)`` with its inputs in the order of its incoming edges.
Every layer returns one tensor ``[b, ...]``.

Each branch of these models starts with a source layer that reads its own slice of the one model
input tensor (:class:`FF` with ``take``), so the model input stays one tensor, as the runtime's
messages are, and the branches still see different data (a multi-modal or multi-tower model's
inputs, packed side by side).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec

__all__ = ["FF", "Concat", "DagBuilder", "Sum"]


class Concat(nn.Module):
    """The merge of branches: ``k × [b, ..., nᵢ]`` → ``[b, ..., Σ nᵢ]`` (concatenated on the last
    dimension, in the order of the layer's incoming edges). No parameters."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=-1)


class Sum(nn.Module):
    """The merge of branches of equal shape: ``k × [b, ...]`` → ``[b, ...]``, their sum."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out


class FF(nn.Module):
    """One feed-forward layer ``ReLU(Linear(x))`` (``relu=False``: the Linear alone, e.g. a head):
    ``[b, ..., d_in]`` → ``[b, ..., d_out]``.

    ``take=(start, stop)`` first keeps the slice ``x[..., start:stop]`` of the input (``stop -
    start == d_in``): a branch's source layer reading its part of the model input. The weight is He
    (Kaiming) normal for ReLU, or N(0, 1/d_in) without it; the bias starts at zero, so deep stacks
    keep their activations' scale under the default learning rates.
    """

    def __init__(
        self, d_in: int, d_out: int, relu: bool = True, take: tuple[int, int] | None = None
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        if relu:
            nn.init.kaiming_normal_(self.linear.weight, nonlinearity="relu")
        else:
            nn.init.normal_(self.linear.weight, std=(1.0 / d_in) ** 0.5)
        nn.init.zeros_(self.linear.bias)
        self.relu = relu
        self.take = take

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.take is not None:
            x = x[..., self.take[0] : self.take[1]]
        y: torch.Tensor = self.linear(x)
        return torch.relu(y) if self.relu else y


class DagBuilder:
    """Collects layers in a topological order and the edges between them.

        >>> b = DagBuilder()
        >>> b.chain("a", [nn.Identity] * 2)        # a0 -> a1; a0 is a source
        'a1'
        >>> b.add("merge", Concat, inputs=["a1", "a0"])
        'merge'
        >>> b.edges
        [('a0', 'a1'), ('a1', 'merge'), ('a0', 'merge')]
    """

    def __init__(self) -> None:
        self.layers: list[Layer] = []
        self.edges: list[tuple[str, str]] = []

    def add(self, name: str, factory: Callable[[], nn.Module], inputs: Sequence[str] = ()) -> str:
        """Append layer ``name`` fed by ``inputs`` (in call order; none: a source layer); its name."""
        self.layers.append(Layer(name, factory))
        self.edges += [(src, name) for src in inputs]
        return name

    def chain(
        self, prefix: str, factories: Sequence[Callable[[], nn.Module]], after: str | None = None
    ) -> str:
        """Append layers ``{prefix}0 … {prefix}{n-1}`` in a chain, the first fed by ``after`` (or
        the model input); the name of the last."""
        last = after
        for i, factory in enumerate(factories):
            last = self.add(f"{prefix}{i}", factory, () if last is None else (last,))
        if last is None:
            raise ValueError("a chain needs at least one layer")
        return last

    def ff_towers(self, prefix: str, count: int, features: int, hidden: int, layers: int) -> list[str]:
        """Append ``count`` towers ``{prefix}{i}_ff0 …`` of ``layers`` FF layers (``hidden`` wide),
        tower ``i`` reading its slice ``[i·features, (i+1)·features)`` of the model input; the
        names of their last layers (CANDLE-Uno's and DLRM's dense towers, GraphPipe §3.1)."""
        ends = []
        for i in range(count):
            first = functools.partial(FF, features, hidden, take=(i * features, (i + 1) * features))
            rest = [functools.partial(FF, hidden, hidden)] * (layers - 1)
            ends.append(self.chain(f"{prefix}{i}_ff", [first, *rest]))
        return ends

    def graph(
        self, name: str, input: TensorSpec, target: TensorSpec, loss: LossKind, seed: int
    ) -> LayerGraph:
        """The LayerGraph of the layers and edges added so far (the last layer added is the sink)."""
        return LayerGraph(
            name=name,
            layers=tuple(self.layers),
            input=input,
            target=target,
            loss=loss,
            seed=seed,
            edges=tuple(self.edges),
        )
