"""LayerGraph's ``edges``: until DAG stages exist, only the chain of its layers is accepted, and any
other edge (a skip connection) is refused with one line instead of training as a chain unnoticed."""

from __future__ import annotations

import pytest
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, TensorSpec

NAMES = ("a", "b", "c", "d")


def graph(edges: tuple[tuple[str, str], ...]) -> LayerGraph:
    layers = tuple(Layer(name, nn.Identity) for name in NAMES)
    return LayerGraph("toy", layers, TensorSpec((4,)), TensorSpec((), "int64", high=4), edges=edges)


@pytest.mark.parametrize("edges", [(), (("a", "b"), ("b", "c"), ("c", "d")), (("c", "d"), ("a", "b"), ("b", "c"))])
def test_chain_edges_are_accepted(edges: tuple[tuple[str, str], ...]) -> None:
    assert graph(edges).names == NAMES


@pytest.mark.parametrize(("edges", "named"), [
    ((("a", "b"), ("b", "c"), ("c", "d"), ("a", "c")), "[('a', 'c')]"),  # a skip edge
    ((("a", "b"), ("b", "c")), "[('a', 'b'), ('b', 'c')]"),  # part of the chain
    ((("a", "b"), ("b", "c"), ("c", "x")), "[('c', 'x')]"),  # an unknown layer
])
def test_other_edges_are_refused_in_one_line(edges: tuple[tuple[str, str], ...], named: str) -> None:
    with pytest.raises(UserError) as error:
        graph(edges)
    message = str(error.value)
    assert "\n" not in message and named in message
    assert "DAG stages are not supported yet" in message and "express the model as a chain" in message
    assert "(a -> b -> c -> ...)" in message
