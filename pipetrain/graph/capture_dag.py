"""When a captured model branches, its layers as a DAG (GraphPipe, issue 15).

:func:`pipetrain.graph.capture.capture` groups the traced nodes into layers (runs of one owner). If
every layer reads only the layer before it, the model is a chain. Otherwise, :func:`branches` gives
each layer's *producers* (the layers whose values it reads, in order) and its *outputs* (its values
that a later layer or the model's output reads); ``capture`` then builds each layer to take one
tensor per producer (that producer's outputs, packed if several) and the graph's edges are the
producer → layer pairs, the DAG contract of :mod:`pipetrain.graph.layer_graph`::

    two towers:   x → tower_a ┐
                  x → tower_b ┴→ head          edges (tower_a, head), (tower_b, head)
    a skip:       stem → a → b(stem, a) → head  edges (stem, a), (stem, b), (a, b), (b, head)

A layer that reads the model input besides other layers' values gets it through the first layer,
which then passes the input along (floating-point inputs only). Where the contract cannot be met
(a value that is not a floating-point tensor would have to be packed, an early layer that nothing
later reads, the output made before the last layer), ``branches`` gives None and the model is
captured as a chain, whose cuts carry every live value.

Branches run at once only where the merge is a layer of its own: code in the root's ``forward``
(``torch.cat([self.a(x), self.b(x)])``) and stateless modules run with the node before them, so
such a merge joins the last branch's layer and that branch waits for the others. A merge module
with weights (``self.merge = nn.Bilinear(...)``), or a hand-built LayerGraph, keeps the branches
independent (``tests/gloo/models.py::Towers``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx

from pipetrain.graph.fx_trace import Part

__all__ = ["CapturedDag", "branches"]


@dataclass(frozen=True)
class CapturedDag:
    """Per layer (run) ``k``: ``producers[k]``, the earlier layers it reads, increasing (none: it reads
    the model input, the node ``placeholder``); ``outputs[k]``, the nodes whose values it gives, in
    graph order."""

    producers: list[list[int]]
    outputs: list[list[fx.Node]]
    placeholder: fx.Node

    def inputs(self, k: int) -> list[list[fx.Node]]:
        """Layer ``k``'s input groups: one per producer (its outputs), or the model input alone."""
        return [self.outputs[p] for p in self.producers[k]] or [[self.placeholder]]


def branches(runs: list[tuple[str, list[fx.Node]]], graph: fx.Graph,
             parts: dict[fx.Node, Part | str]) -> CapturedDag | None:
    """The layers' data dependencies if they are not a chain and fit the DAG contract, else None."""
    layer_of = {node: k for k, (_, nodes) in enumerate(runs) for node in nodes}
    producers = [_producers(k, nodes, layer_of) for k, (_, nodes) in enumerate(runs)]
    if all(p == ([k - 1] if k else [-1]) for k, p in enumerate(producers)):
        return None  # a chain
    outputs = [[node for node in nodes if any(layer_of.get(user) != k for user in node.users)]
               for k, (_, nodes) in enumerate(runs)]
    returned = next(node for node in graph.nodes if node.op == "output").args[0]
    read = {p for ps in producers for p in ps}
    if outputs[-1] != [returned] or any(k not in read for k in range(len(runs) - 1)):
        return None
    placeholder = next(node for node in graph.nodes if node.op == "placeholder")
    mixed = [k for k, p in enumerate(producers) if -1 in p and len(p) > 1]
    if mixed:
        if producers[0] != [-1]:
            return None
        outputs[0].insert(0, placeholder)
        for k in mixed:
            producers[k] = sorted({0, *producers[k]} - {-1})
    if not all(_packable(group, parts) for group in outputs):
        return None
    return CapturedDag([[p for p in ps if p >= 0] for ps in producers], outputs, placeholder)


def _producers(k: int, nodes: list[fx.Node], layer_of: dict[fx.Node, int]) -> list[int]:
    """The layers (``-1``: the model input) whose values run ``k`` reads."""
    found = set()
    for node in nodes:
        for source in node.all_input_nodes:
            if source.op == "placeholder":
                found.add(-1)
            elif source in layer_of and layer_of[source] != k:
                found.add(layer_of[source])
    return sorted(found)


def _packable(group: list[fx.Node], parts: dict[fx.Node, Part | str]) -> bool:
    """One tensor, or several floating-point tensors of one dtype (what travels as one tensor)."""
    found = [parts.get(node) for node in group]
    if not all(isinstance(part, Part) for part in found):
        return False
    dtypes = {part.dtype for part in found if isinstance(part, Part)}
    return len(found) == 1 or (len(dtypes) == 1 and dtypes.pop().is_floating_point)
