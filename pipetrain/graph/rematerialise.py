"""Recompute, rather than send, the values a layer reads that depend only on shapes and constants.

A model's own ``forward`` often computes, once, values that every block then reads: the batch size
(``b = input_ids.shape[0]``), a causal mask built from positions, a rotary embedding's ``cos`` and
``sin`` (``[1, T, d]``, from a constant buffer). Cut into layers, these would cross every cut, and
the runtime's messages carry only tensors batched along dim 0 (a symbolic size or a ``[1, T, d]``
table is neither). So each layer that reads one gets its own copy of the operations that make it
(Megatron and torch's pipelining recompute such masks per stage too); the batch size becomes the
batch size of a tensor the layer receives anyway::

    layer 0:  b = sym_size(x, 0); mask = causal(T).expand(b, …); h = embed(x)
    layer 3:  h  ← received            layer 3 before:  b, mask, h  ← received
              b = sym_size(h, 0); mask = causal(T).expand(b, …)

A value is *recomputable* when the operations behind it read no input data, no parameter (which
would then be used by two layers) and draw no random numbers: only constants, non-trainable
buffers, and the batch size.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from pipetrain.graph.fx_trace import Part

__all__ = ["rematerialise"]

Runs = list[tuple[str, list[fx.Node]]]


def rematerialise(root: nn.Module, runs: Runs, parts: dict[fx.Node, Part | str]) -> None:
    """Give each layer of ``runs`` (``(owner, nodes)`` in graph order) its own copy of every
    recomputable value it reads from another layer; the graph and ``runs`` change in place. The
    batch size is taken from the first batched tensor the cut before the layer carries."""
    recomputable = _Recomputable(root)
    layer_of = {node: k for k, (_, nodes) in enumerate(runs) for node in nodes}
    for k, (owner, nodes) in enumerate(runs):
        wanted = [node for node in _foreign_inputs(nodes, k, layer_of) if recomputable(node)]
        if not wanted:
            continue
        anchor = next((node for node in _live_into(k, runs, layer_of)
                       if not recomputable(node) and isinstance(parts.get(node), Part)), None)
        if anchor is None:
            continue
        copier = _Copier(anchor)
        with nodes[0].graph.inserting_before(nodes[0]):
            for node in wanted:
                copier(node)
        for node in nodes:
            for value in wanted:
                node.replace_input_with(value, copier.copies[value])
        runs[k] = (owner, copier.added + nodes)
        layer_of.update(dict.fromkeys(copier.added, k))


class _Copier:
    """Copies a recomputable value's operations at the graph's insertion point, once each; the
    batch size becomes that of ``anchor``, a batched tensor the layer receives."""

    def __init__(self, anchor: fx.Node) -> None:
        self.anchor = anchor
        self.copies: dict[fx.Node, fx.Node] = {}
        self.added: list[fx.Node] = []

    def __call__(self, node: fx.Node) -> fx.Node:
        if node.op == "get_attr":
            return node
        if node not in self.copies:
            if _is_batch_size(node):
                made = node.graph.call_function(torch.ops.aten.sym_size.int, (self.anchor, 0))
            else:
                made = node.graph.node_copy(node, self)
            made.meta = dict(node.meta)
            self.copies[node] = made
            self.added.append(made)
        return self.copies[node]


def _foreign_inputs(nodes: list[fx.Node], k: int, layer_of: dict[fx.Node, int]) -> list[fx.Node]:
    """The values that run ``k`` reads from other runs, in the order it first reads them."""
    found: dict[fx.Node, None] = {}
    for node in nodes:
        for source in node.all_input_nodes:
            if source in layer_of and layer_of[source] != k:
                found.setdefault(source)
    return list(found)


def _live_into(k: int, runs: Runs, layer_of: dict[fx.Node, int]) -> list[fx.Node]:
    """The values made before run ``k`` and used by it or later: what the cut before it carries."""
    return [node for _, nodes in runs[:k] for node in nodes
            if any(layer_of.get(user, len(runs)) >= k for user in node.users)]


def _is_batch_size(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.aten.sym_size.int and bool(node.args[1] == 0)


class _Recomputable:
    """Whether a node's value depends only on shapes and constants (module docstring), memoised."""

    def __init__(self, root: nn.Module) -> None:
        self.parameters = {name for name, _ in root.named_parameters(remove_duplicate=False)}
        self.memo: dict[fx.Node, bool] = {}

    def __call__(self, node: fx.Node) -> bool:
        if node not in self.memo:
            self.memo[node] = self._decide(node)
        return self.memo[node]

    def _decide(self, node: fx.Node) -> bool:
        if node.op == "get_attr":
            return str(node.target) not in self.parameters
        if node.op not in ("call_function", "call_method"):
            return False
        if _is_batch_size(node):
            return True
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in target.tags or bool(target._schema.is_mutable)
        ):
            return False
        return all(self(source) for source in node.all_input_nodes)
