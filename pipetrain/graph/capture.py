"""Capture any ``nn.Module`` as a LayerGraph with ``torch.fx`` (issue 12 §1).

:func:`capture` traces the module's ``forward`` into one fx graph and cuts it into layers:

* **Owner.** Every node belongs to a module: a ``call_module`` node to the module it calls, any
  other node to the module whose ``forward`` created it. That module's layer is its *owner*
  (:mod:`pipetrain.graph.owners`): one layer per entry of a ``ModuleList``, ``Sequential`` or
  ``ModuleDict`` at any depth (``blocks.0.attn.out_proj`` → ``blocks.0``,
  ``encoder.layers.3.mlp`` → ``encoder.layers.3``), modules that hold such containers walked
  through, any other module below the root a layer. Code in the root's own ``forward``
  (``x = x + self.block(x)``) and in walked-through modules runs with the node before it; a layer
  without parameters or persistent buffers (activations, pooling, dropout) joins the layer before
  it. ``get_attr`` nodes are copied into every layer that reads them.
* **Layer.** A maximal run of consecutive nodes with one owner, named after it.
* **Edges.** When a layer reads values of layers other than the one before it (branches, skips),
  the graph is a DAG: each layer takes one tensor per layer it reads, that layer's outputs
  (:mod:`pipetrain.graph.capture_dag`), and chain plans linearise it (:mod:`pipetrain.graph.dataflow`).
* **Cut.** Otherwise a chain: the tensors made before a cut and used after it cross it. One tensor
  crosses as is; several are *packed*: each ``[b, *shape]`` part flattened to ``[b, n]`` and
  concatenated into ``[b, Σn]``, which the next layer splits back by the recorded per-sample
  shapes. So every layer boundary stays one tensor.

Each layer is a :class:`CapturedLayer` whose ``state_dict`` keys are the model's own names
(``blocks.0.attn.in_proj_weight``): the layers' state dicts together are the module's, key for key
(state that ``forward`` never reads goes to the layer whose name prefixes it, else the first). A
parameter or persistent buffer that two layers share (tied weights) is listed in ``LayerGraph.ties``
(:mod:`pipetrain.graph.ties`); a non-persistent buffer or a constant is copied into each layer that
reads it.

    >>> graph = capture(model, input=TensorSpec((64,)), target=TensorSpec((), "int64", high=10),
    ...                 loss=LossKind.CROSS_ENTROPY, name="my-model")   # doctest: +SKIP
    >>> graph.names                                                     # doctest: +SKIP
    ('stem', 'blocks.0', 'blocks.1', 'head')

A layer's code that changes one of its inputs in place (an in-place activation first thing in a
block) gets a copy of that input: what a stage receives is a leaf of autograd, which in-place
operations may not touch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.graph import inplace_methods

from pipetrain.errors import UserError
from pipetrain.graph.capture_dag import branches
from pipetrain.graph.devices import named_device, retarget
from pipetrain.graph.fx_trace import Part, innermost_module, sample_parts, trace
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec, _Copy
from pipetrain.graph.owners import CONTAINERS, Owners, group, merge_stateless
from pipetrain.graph.packing import Slot, pack, unpack
from pipetrain.graph.rematerialise import rematerialise
from pipetrain.graph.ties import find_ties

__all__ = ["CapturedLayer", "capture", "capture_traced"]

_LEAF = "mark the module that {} a leaf (leaf_modules=[...] / --leaf module.path:Class)"


def capture(
    module: nn.Module,
    *,
    input: TensorSpec,
    target: TensorSpec,
    loss: LossKind,
    name: str,
    leaf_modules: Sequence[type[nn.Module]] = (),
    seed: int = 0,
) -> LayerGraph:
    """``module`` as a chain of layers, each holding a copy of the module's current weights.

    Args:
        module: any module whose ``forward`` takes one tensor ``[b, *input.shape]`` (other
            parameters must have defaults) and returns one tensor ``[b, ...]``.
        input, target: per-sample specs of the input and the target.
        loss: the loss kind.
        name: the graph's name.
        leaf_modules: module classes to keep whole (not traced into): each runs inside one layer.
            Modules of ``torch.nn`` other than containers are always kept whole.
        seed: ``LayerGraph.seed``.

    Raises:
        UserError: the module cannot be traced, runs a module at two separate places, or passes
            across a cut tensors that cannot be packed.
    """
    root = copy.deepcopy(module)  # a snapshot: later changes to the user's module do not leak in
    traced = trace(root, leaf_modules, name)
    return capture_traced(root, traced, input=input, target=target, loss=loss, name=name, seed=seed)


def capture_traced(root: nn.Module, traced: fx.GraphModule, *, input: TensorSpec, target: TensorSpec,
                   loss: LossKind, name: str, seed: int = 0) -> LayerGraph:
    """The LayerGraph of ``traced``, a graph of one placeholder (the input) and one output over
    ``root``'s modules and tensors (from fx, or from ``torch.export`` by
    :mod:`pipetrain.graph.export_capture`), cut as the module docstring says."""
    runs = _runs(root, traced.graph, name)
    parts = sample_parts(traced, input, name)
    rematerialise(root, runs, parts)
    model = _Model(root, frozenset(root.state_dict()))
    dag = branches(runs, traced.graph, parts)
    if dag is not None:
        layers = [_build_layer(model, nodes, dag.inputs(k), dag.outputs[k], parts)
                  for k, (_, nodes) in enumerate(runs)]
    else:
        cuts = _cuts(runs, traced.graph)
        for k in range(1, len(cuts)):
            _check_cut(name, root, runs, k, cuts[k], parts)
        layers = [_build_layer(model, nodes, [cuts[k]], cuts[k + 1], parts) for k, (_, nodes) in enumerate(runs)]
    owners = [owner for owner, _ in runs]
    _attach_unused_state(model, layers, owners)
    built = tuple(Layer(owner, _Copy(layer), prefix="") for owner, layer in zip(owners, layers, strict=True))
    edges = () if dag is None else tuple((owners[p], owners[k]) for k, ps in enumerate(dag.producers) for p in ps)
    ties = find_ties(list(zip(built, layers, strict=True)))
    return LayerGraph(name, built, input, target, loss, seed, edges=edges, ties=ties, module=_Copy(root))


# ---- grouping nodes into layers --------------------------------------------------------------


def _runs(root: nn.Module, graph: fx.Graph, name: str) -> list[tuple[str, list[fx.Node]]]:
    """``(owner, nodes)`` per layer, in graph order (:mod:`pipetrain.graph.owners`: glue joins the
    node before, stateless runs the layer before); the placeholder, output and get_attr nodes in none.

    Raises:
        UserError: a module that runs at two separate places (its weights would sit in two layers).
    """
    called = {id(root.get_submodule(str(node.target))) for node in graph.nodes if node.op == "call_module"}
    owners = Owners(root, whole=lambda module: id(module) in called)
    owned: list[tuple[fx.Node, str | None]] = []
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        path = _module_path(node)
        owned.append((node, owners(path) if path else None))
    runs = [(owner or "model", nodes) for owner, nodes in merge_stateless(group(owned), owners.stateless)]
    seen = [owner for owner, _ in runs]
    for k, owner in enumerate(seen):
        if owner in seen[:k]:
            raise UserError(
                f"module {owner!r} of {name!r} runs at two separate places in forward (before and after "
                f"{seen[k - 1]!r}), so it cannot be one layer; give each call its own module, or "
                + _leaf_remedy(root, [owner.rpartition(".")[0]], "makes both calls")
            )
    return runs


def _module_path(node: fx.Node) -> str:
    """The module that runs ``node``: the one it calls, else the one whose forward made it; ``""``: the root."""
    if node.op == "call_module":
        return str(node.target)
    module = innermost_module(node.meta.get("nn_module_stack") or {})
    return module[0] if module else ""


def _leaf_remedy(root: nn.Module, paths: Sequence[str], what: str) -> str:
    """``mark Encoder ('encoder', which {what}) a leaf ...``: the innermost module other than the root
    and containers that runs all of ``paths`` (module paths) in its forward; kept whole, it is one
    layer, so what fails between its layers no longer happens. Unnamed if that is the root."""
    common: list[str] = []
    for names in zip(*(path.split(".") if path else [] for path in paths), strict=False):  # to the shortest
        if len(set(names)) > 1:
            break
        common.append(names[0])
    while common and isinstance(root.get_submodule(".".join(common)), CONTAINERS):
        common.pop()
    if not common:
        return _LEAF.format(what)
    cls = type(root.get_submodule(".".join(common)))
    return (f"mark {cls.__name__} ({'.'.join(common)!r}, which {what}) a leaf, run whole inside one layer "
            f"(leaf_modules=[{cls.__name__}] / --leaf {cls.__module__}:{cls.__qualname__})")


def _cuts(runs: list[tuple[str, list[fx.Node]]], graph: fx.Graph) -> list[list[fx.Node]]:
    """``cuts[k]``: the nodes whose values layer ``k`` receives, in graph order; ``cuts[0]`` is the
    input placeholder and ``cuts[len(runs)]`` the model's output."""
    n = len(runs)
    layer_of = {node: k for k, (_, nodes) in enumerate(runs) for node in nodes}
    produced = [node for node in graph.nodes if node.op == "placeholder"] + list(layer_of)
    made = {node: layer_of.get(node, -1) for node in produced}
    last = {node: max((layer_of.get(user, n) for user in node.users), default=-1) for node in produced}
    cuts = [[node for node in produced if made[node] < k <= last[node]] for k in range(n + 1)]
    cuts[0] = produced[:1]
    return cuts


def _check_cut(name: str, root: nn.Module, runs: list[tuple[str, list[fx.Node]]], k: int,
               crossing: list[fx.Node], parts: dict[fx.Node, Part | str]) -> None:
    """Check that the values crossing cut ``k`` (before layer ``k``; ``len(runs)``: the model's
    output) can travel as one tensor.

    Raises:
        UserError: naming the cut, the values and their shapes, and the fix.
    """
    found = [parts[node] for node in crossing]
    values = ", ".join(f"{node.name!r} ({part})" for node, part in zip(crossing, found, strict=True))
    tensors = [part for part in found if isinstance(part, Part)]
    if k == len(runs):
        if not tensors:
            raise UserError(f"{name!r} returns {values}; return one tensor, batched along dim 0, for the loss")
        return
    if len(tensors) == len(found):
        return
    hint = "compute sizes where they are used (x.shape[0] in the later code), " if "not a tensor" in found else ""
    remedy = _leaf_remedy(root, [_module_path(n) for node in crossing for n in (node, *node.users)], "spans this cut")
    raise UserError(
        f"cannot cut {name!r} between layers {runs[k - 1][0]!r} and {runs[k][0]!r}: what crosses it, "
        f"{values or 'nothing'}, cannot travel as one tensor (every value must be a tensor batched along dim 0); "
        f"{hint}{remedy}, or pass an nn.Sequential"
    )


# ---- layers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Model:
    """The traced copy of the user's module and its ``state_dict`` keys (persistent state)."""

    root: nn.Module
    state_names: frozenset[str]


def _build_layer(model: _Model, nodes: list[fx.Node], inputs: list[list[fx.Node]], outputs: list[fx.Node],
                 parts: dict[fx.Node, Part | str]) -> CapturedLayer:
    """Layer of ``nodes``: takes one tensor per group of ``inputs`` (the values of the group, packed if
    several), gives those of ``outputs`` (packed if several)."""
    graph = fx.Graph()
    env = {node: graph.placeholder(node.name) for group in inputs for node in group}

    def lookup(node: fx.Node) -> fx.Node:
        if node not in env:  # a get_attr: each layer that reads it gets its own
            env[node] = graph.node_copy(node, lookup)
        return env[node]

    for node in nodes:
        env[node] = graph.node_copy(node, lookup)
    graph.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[node] for node in outputs))
    slots = tuple(None if len(group) == 1 else tuple(_slot(parts[node]) for node in group) for group in inputs)
    return CapturedLayer(model, graph, slots, packs=len(outputs) > 1)


def _slot(part: Part | str) -> Slot:
    assert isinstance(part, Part), "checked by _check_cut"
    return Slot(part.shape, part.dtype)


class CapturedLayer(nn.Module):
    """One layer of a captured model: ``*xs`` → unpack → the model's own nodes → pack.

    One tensor per input group: a chain's layer has one group (what crosses the cut before it), a
    DAG's one per producing layer (that layer's outputs). A group of one value is that value as is;
    of several, ``x [b, Σ nᵢ]`` holds each part ``[b, *shapeᵢ]`` side by side
    (:func:`pipetrain.graph.packing.pack`: flattened, or as its bytes when its dtype is not the
    carrier's), and is split back by ``slots``. Outputs likewise: several are packed into one
    ``[b, Σ mⱼ]``. The modules and tensors the nodes use sit at the model's own paths, so
    ``state_dict`` keys are the model's names (``blocks.0.fc.weight``). The code is an fx
    GraphModule's generated ``forward``, run with this module as ``self``;
    the GraphModule is kept outside the module tree (no state of its own).
    """

    _code: fx.GraphModule

    def __init__(self, model: _Model, graph: fx.Graph, slots: tuple[tuple[Slot, ...] | None, ...],
                 packs: bool) -> None:
        super().__init__()
        self._unpack_slots = slots
        self._packs = packs
        targets = {str(node.target) for node in graph.nodes if node.op in ("call_module", "get_attr")}
        for target in sorted(targets, key=_tree_order(model.root)):  # the model's order: deterministic names
            _attach(self, model, target)
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        self._copied = frozenset(i for i, node in enumerate(placeholders)
                                 if any(_in_place(self, user) and user.args[0] is node for user in node.users))
        object.__setattr__(self, "_code", fx.GraphModule(self, graph, class_name="CapturedCode"))
        self._device = named_device(graph)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        """One ``[b, ...]`` per input group (packed ``[b, Σ nᵢ]`` if several values) → ``[b, ...]``
        (packed if several outputs)."""
        if self._device is not None and xs[0].device != self._device:  # code traced elsewhere (devices.py)
            self._device = xs[0].device
            retarget(self._code.graph, self._device)
            self._code.recompile()
        parts = [part for x, slots in zip(xs, self._unpack_slots, strict=True)
                 for part in ((x,) if slots is None else unpack(x, slots))]
        parts = [part.clone() if i in self._copied else part for i, part in enumerate(parts)]
        code: Callable[..., Any] = type(self._code).forward
        out = code(self, *parts)
        return pack(out) if self._packs else out  # type: ignore[no-any-return]

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling rebuilds ``_code`` by tracing its code again, which turns values computed from
        buffers alone (a rotary table) into new constants held by ``_code``: hold them here too, as
        buffers outside the ``state_dict``, since the code runs with this module as ``self``."""
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        for node in self._code.graph.nodes:
            target = str(node.target)
            if node.op == "get_attr" and not _has_path(self, target):
                self.register_buffer(target, self._code.get_buffer(target), persistent=False)

    def extra_repr(self) -> str:
        return f"unpacks={self._unpack_slots}, packs={self._packs}, copies={sorted(self._copied)}"


def _has_path(module: nn.Module, target: str) -> bool:
    """Whether ``module`` holds something at the dotted path ``target``."""
    owner, _, field = target.rpartition(".")
    try:
        return hasattr(module.get_submodule(owner), field)
    except AttributeError:
        return False


def _in_place(holder: nn.Module, node: fx.Node) -> bool:
    """Whether ``node`` changes its first argument in place: a module built with ``inplace=True``,
    ``F.relu(x, inplace=True)``, ``x.relu_()``, ``torch.relu_(x)``, ``x[i] = v``, ``operator.iadd``."""
    if not node.args:
        return False
    if node.op == "call_module":
        return getattr(holder.get_submodule(str(node.target)), "inplace", False) is True
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).startswith("_")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return node.kwargs.get("inplace") is True or (name.endswith("_") and not name.startswith("_")) \
            or name in inplace_methods
    return False


def _tree_order(root: nn.Module) -> Callable[[str], tuple[int, int, str]]:
    """A sort key putting module paths and attributes in the order of ``root.named_modules()``
    (a module before what it holds), so a layer's parameters are registered, named and hashed in
    the same order in every process."""
    index = {name: i for i, (name, _) in enumerate(root.named_modules())}

    def key(target: str) -> tuple[int, int, str]:
        parts = target.split(".")
        for depth in range(len(parts), 0, -1):
            owner = ".".join(parts[:depth])
            if owner in index:
                return index[owner], len(parts) - depth, target
        return -1, len(parts), target

    return key


def _attach(holder: nn.Module, model: _Model, target: str) -> None:
    """Put the module or tensor at ``target`` of the model at the same path of ``holder``, with
    plain ``nn.Module`` s on the way; a buffer keeps its persistence, a plain tensor stays plain."""
    *path, field = target.split(".")
    source, dest = model.root, holder
    for part in path:
        source = getattr(source, part)
        existing = getattr(dest, part, None)
        if existing is source:  # the whole module is already there
            return
        if existing is None:
            existing = nn.Module()
            dest.add_module(part, existing)
        dest = existing
    value = getattr(source, field)
    if hasattr(dest, field):
        return
    if isinstance(value, torch.Tensor) and field in dict(source.named_buffers(recurse=False)):
        dest.register_buffer(field, value, persistent=target in model.state_names)
    else:
        setattr(dest, field, value)  # a module, a parameter, or a plain tensor attribute


def _attach_unused_state(model: _Model, layers: list[CapturedLayer], owners: list[str]) -> None:
    """Give every state entry that forward never reads to a layer, so that the layers' state dicts
    together are the model's: the layer holding the same tensor, else the one whose name prefixes
    it, else the first."""
    holder: dict[int, int] = {}
    keys: set[str] = set()
    for k, layer in enumerate(layers):
        for key, tensor in layer.state_dict(keep_vars=True).items():
            holder[id(tensor)] = k
            keys.add(key)
    for key, tensor in model.root.state_dict(keep_vars=True).items():
        if key not in keys:
            prefixed = (k for k, owner in enumerate(owners) if key.startswith(f"{owner}."))
            _attach(layers[holder.get(id(tensor), next(prefixed, 0))], model, key)
