"""Which tensors cross a stage's boundary, and the module that runs a stage of any LayerGraph.

A stage is a set of layers (a run of a chain, or a convex part of a DAG, GraphPipe §3.2 C1). Its
boundary is described by *ports*: each port is one tensor on the wire and lists the values it
carries, as layer indices (``MODEL_INPUT`` for the model input)::

    chain stage of layers 2..4      in  [(1,)]            out [(4,)]
    DAG, linearised (chain plans)   in  [(−1, 1)]         out [(−1, 3, 4)]   everything live at the cut
    DAG stage (method graph)        in  [(1,), (2,)]      out [(5,), (5,)]   one port per peer stage

A port of one value carries that tensor as is, ``[b, *shape]``. A port of several carries them
*packed*: each flattened to ``[b, nᵢ]`` and concatenated into ``[b, Σ nᵢ]`` (floating point only),
as :mod:`pipetrain.graph.capture` packs the tensors crossing a cut. So a chain plan runs any DAG by
linearising it (skip tensors ride along through the stages in between), and the runtime's messages
stay one tensor each.

    >>> ports = chain_ports(graph, [2, 3])          # doctest: +SKIP
    >>> StageModule(graph, [2, 3], *ports)(x)       # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec

__all__ = [
    "MODEL_INPUT", "Port", "StageModule", "chain_ports", "chain_stage", "layer_input", "layer_port", "live_after",
    "pack", "port_spec", "profiled_layer", "whole_model",
]

MODEL_INPUT = -1
"""The value index of the model input in a port."""

Port = tuple[int, ...]


def live_after(graph: LayerGraph, done: set[int]) -> Port:
    """Values made by the layers in ``done`` (or the model input) and read by a layer not in it, in
    index order (the model input first): what a cut after ``done`` must carry."""
    out = []
    rest = [i for i in range(len(graph)) if i not in done]
    if any(not graph.predecessors(i) for i in rest):
        out.append(MODEL_INPUT)
    out += [i for i in sorted(done) if any(j not in done for j in graph.successors(i))]
    if not rest:
        out.append(len(graph) - 1)
    return tuple(out)


def chain_ports(graph: LayerGraph, indices: Sequence[int]) -> tuple[list[Port], list[Port]]:
    """The input and output port of a stage of consecutive layers ``indices`` of a chain plan."""
    first, last = min(indices), max(indices)
    before = set(range(first))
    after = live_after(graph, before | set(range(first, last + 1)))
    return [live_after(graph, before) if first else (MODEL_INPUT,)], [after]


def port_spec(graph: LayerGraph, port: Port, outputs: Sequence[TensorSpec] | None = None) -> TensorSpec:
    """Per-sample spec of the tensor a port carries (packed: ``(Σ nᵢ,)`` of the values' dtype);
    ``outputs``: ``graph.output_specs()`` when the caller has them (they take a meta forward pass).

    Raises:
        UserError: a packed port with a value that is not floating point or of mixed dtypes.
    """
    made = graph.output_specs() if outputs is None else outputs
    specs = [graph.input if v == MODEL_INPUT else made[v] for v in port]
    if len(specs) == 1:
        return specs[0]
    dtypes = {s.dtype for s in specs}
    if len(dtypes) > 1 or not torch.empty((), dtype=specs[0].torch_dtype).is_floating_point():
        raise UserError(f"model {graph.name!r}: a stage boundary must carry {len(specs)} tensors at once "
                        f"({', '.join(_label(graph, v) for v in port)}) but they are not all of one floating "
                        "point dtype; cut the model elsewhere, or run it with --method graph")
    return TensorSpec((sum(math.prod(s.shape) for s in specs),), specs[0].dtype)


def _label(graph: LayerGraph, value: int) -> str:
    return "the model input" if value == MODEL_INPUT else repr(graph.layers[value].name)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One tensor ``[b, Σ nᵢ]`` (or the single tensor as is)."""
    if len(tensors) == 1:
        return tensors[0]
    return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)


class StageModule(nn.Module):
    """Runs the layers ``indices`` of ``graph`` between input and output ports.

    ``forward(*inputs)`` takes one tensor per input port and returns one tensor per output port (the
    tensor itself when there is one port). Children are the layers, named ``"0"``, ``"1"``, … in
    ``indices`` order, with tied tensors made one, as in ``graph.build_sequential(indices)``, so state
    dicts and :func:`~pipetrain.runtime.interp.rank_setup.stage_state_dict` treat both alike.
    """

    def __init__(self, graph: LayerGraph, indices: Sequence[int], inputs: Sequence[Port], outputs: Sequence[Port],
                 *, device: torch.device | str | None = None, names: Sequence[str] | None = None) -> None:
        super().__init__()
        self.indices = tuple(indices)
        for position, i in enumerate(self.indices):
            self.add_module(str(position) if names is None else names[position], graph.build_layer(i, device))
        graph.tied(self, self.indices)
        self.layer_inputs = tuple(graph.predecessors(i) or (MODEL_INPUT,) for i in self.indices)
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        values = {v for port in self.inputs for v in port}
        made = graph.output_specs() if values - {MODEL_INPUT} else ()
        self.shapes = {v: (graph.input if v == MODEL_INPUT else made[v]).shape for v in values}
        missing = {v for args in self.layer_inputs for v in args} - set(self.indices) - set(self.shapes)
        if missing:
            raise UserError(f"stage of layers {[graph.layers[i].name for i in self.indices]} reads "
                            f"{', '.join(_label(graph, v) for v in sorted(missing))} but no input port carries it")

    def forward(self, *xs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        values: dict[int, torch.Tensor] = {}
        for port, x in zip(self.inputs, xs, strict=True):
            values.update(self._unpack(port, x))
        for i, args, layer in zip(self.indices, self.layer_inputs, self.children(), strict=True):
            values[i] = layer(*(values[v] for v in args))
        out = tuple(pack([values[v] for v in port]) for port in self.outputs)
        return out[0] if len(out) == 1 else out

    def _unpack(self, port: Port, x: torch.Tensor) -> dict[int, torch.Tensor]:
        if len(port) == 1:
            return {port[0]: x}
        widths = [math.prod(self.shapes[v]) for v in port]
        parts = torch.split(x, widths, dim=1)
        return {v: part.reshape(x.shape[0], *self.shapes[v]) for v, part in zip(port, parts, strict=True)}


def layer_port(graph: LayerGraph, i: int) -> Port:
    """What layer ``i`` reads, as one port (its predecessors, or the model input)."""
    return graph.predecessors(i) or (MODEL_INPUT,)


def profiled_layer(graph: LayerGraph, i: int, device: torch.device | str | None = None) -> nn.Module:
    """Layer ``i`` as a one-tensor module for the profilers: the layer itself when it reads one
    tensor, else a :class:`StageModule` of it alone that unpacks its packed inputs (:func:`layer_input`)."""
    port = layer_port(graph, i)
    if len(port) == 1:
        return graph.build_layer(i, device)
    return StageModule(graph, [i], [port], [(i,)], device=device)


def layer_input(graph: LayerGraph, i: int, model_input: torch.Tensor, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Layer ``i``'s input for :func:`profiled_layer`, from the model input and the earlier layers' ``outputs``."""
    return pack([model_input if v == MODEL_INPUT else outputs[v] for v in layer_port(graph, i)])


def chain_stage(graph: LayerGraph, indices: Sequence[int], device: torch.device | str | None = None) -> nn.Module:
    """A chain plan's stage of consecutive layers: ``nn.Sequential`` of a chain model, else a
    :class:`StageModule` between its cuts (the model linearised)."""
    if graph.is_chain:
        module = graph.build_sequential(indices)
        # a move may give each holder of a tied tensor its own copy (meta does): tie them again
        return module if device is None else graph.tied(module.to(device), indices)
    return StageModule(graph, indices, *chain_ports(graph, indices), device=device)


def whole_model(graph: LayerGraph) -> nn.Module:
    """The unpipelined model with positional children (``graph.build_sequential()`` for a chain):
    the reference that pipelined training must reproduce."""
    return chain_stage(graph, range(len(graph)))
