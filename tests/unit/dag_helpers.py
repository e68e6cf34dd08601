"""Helpers for tests of DAG LayerGraphs: the DAG contract checked and run in one process.

The contract (pipetrain.graph.layer_graph): layers in a topological order, every edge from an
earlier to a later layer, the last layer the only sink; a source layer (no incoming edge) is
called on the model input, any other as ``module(*inputs)`` in the order of its incoming edges.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from pipetrain.graph.layer_graph import LayerGraph


def inputs_of(graph: LayerGraph, i: int) -> list[int]:
    """Indices of layer ``i``'s inputs, in call order (``[]``: a source layer)."""
    name = graph.layers[i].name
    return [graph.index(src) for src, dst in graph.edges if dst == name]


def check_contract(graph: LayerGraph) -> None:
    """Assert ``graph`` is a DAG under the contract and not a chain."""
    names = graph.names
    assert len(set(names)) == len(names)
    position = {name: i for i, name in enumerate(names)}
    assert all(src in position and dst in position for src, dst in graph.edges)
    assert len(set(graph.edges)) == len(graph.edges)
    assert all(position[src] < position[dst] for src, dst in graph.edges), "edges must go forward"
    with_successor = {src for src, _ in graph.edges}
    assert names[-1] not in with_successor, "the last layer is the sink"
    assert set(names[:-1]) <= with_successor, "every other layer has a successor"
    sources = [i for i in range(len(graph)) if not inputs_of(graph, i)]
    assert sources and sources[0] == 0
    assert len(sources) > 1 or any(len(inputs_of(graph, i)) > 1 for i in range(len(graph))), "a DAG, not a chain"


def run_dag(graph: LayerGraph, modules: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """The model's output ``[b, ...]`` for input ``x`` ``[b, *graph.input.shape]``, by the contract."""
    outputs: list[torch.Tensor] = []
    for i, module in enumerate(modules):
        args = [outputs[j] for j in inputs_of(graph, i)] or [x]
        outputs.append(module(*args))
    return outputs[-1]
