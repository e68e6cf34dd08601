"""LayerGraph's ``edges``: the chain, or a DAG under the contract of layer_graph.py (topological order,
the last layer the only sink); anything else is refused with one line."""

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


def test_a_dag_is_accepted_and_wired() -> None:
    """A skip edge makes a DAG: ``c`` reads ``b`` and ``a`` in the order the edges list them."""
    dag = graph((("a", "b"), ("b", "c"), ("a", "c"), ("c", "d")))
    assert not dag.is_chain
    assert [dag.predecessors(i) for i in range(4)] == [(), (0,), (1, 0), (2,)]
    assert [dag.successors(i) for i in range(4)] == [(1, 2), (2,), (3,), ()]
    assert dag.fingerprint() != graph(()).fingerprint()


@pytest.mark.parametrize(("edges", "named"), [
    ((("a", "b"), ("b", "c")), "the last layer must be the only one without successors"),  # 'c' and 'd' dangle
    ((("a", "b"), ("b", "c"), ("c", "x")), "[('c', 'x')]"),  # an unknown layer
    ((("a", "b"), ("c", "b"), ("b", "d"), ("c", "d")), "[('c', 'b')]"),  # goes backward
    ((("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")), "[('d', 'a')]"),  # a cycle
])
def test_bad_edges_are_refused_in_one_line(edges: tuple[tuple[str, str], ...], named: str) -> None:
    with pytest.raises(UserError) as error:
        graph(edges)
    message = str(error.value)
    assert "\n" not in message and named in message
