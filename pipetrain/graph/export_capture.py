"""Capture a model of keyword inputs that returns a ``ModelOutput`` (Hugging Face) with ``torch.export``.

Hugging Face ``transformers`` 5.x models take keyword tensors (``input_ids``, ``attention_mask``,
...), build their attention masks with data-dependent Python, and return a ``ModelOutput``:
``torch.fx`` cannot trace them (their forwards are wrapped by decorators fx cannot re-bind, and
their mask code branches on values), and transformers dropped its own fx tracer. ``torch.export``
(non-strict) runs the forward in Python on fake tensors, so it takes every such branch once for the
shapes given, and it is what transformers tests its models against and what torch's own
``torch.distributed.pipelining.pipeline()`` splits. The graph it gives is of ATen operations, each
node tagged with the module stack it ran in (``nn_module_stack``); :func:`capture_exported` turns it
into the same form :func:`pipetrain.graph.capture.capture` builds from fx and hands it on:

* **Weights by name.** The exported graph takes parameters and buffers as inputs; each becomes a
  ``get_attr`` of its qualified name (``transformer.h.0.attn.c_attn.weight``), so every layer holds
  the model's own tensors under the model's own names and ``state_dict`` keys are the model's.
  Tied weights (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) arrive under both names,
  one tensor.
* **One input.** The model's keyword inputs arrive packed in one tensor (:mod:`pipetrain.graph.packing`,
  the layout in ``input.fields``); the graph starts by unpacking it.
* **One output.** The ``ModelOutput``'s ``logits`` (else its only tensor) is the model's output; the
  loss that transformers computes from ``labels`` is left out (pipetrain's loss is a plan's,
  :data:`~pipetrain.graph.layer_graph.LossKind.CAUSAL_LM` for causal LMs).
* **Training and evaluation.** Export records dropout as run in training mode; each dropout, and
  each attention's dropout, becomes a module again (:mod:`pipetrain.graph.training_only`), so
  ``eval()`` turns it off as in the original model. Shape assertions
  are dropped (the batch dimension is dynamic: micro-batches of any size run the same layers).

Layers are then cut at block granularity by the owner rule of :mod:`pipetrain.graph.capture`
(``transformer.wte``, ``transformer.h.0``, ..., ``lm_head``); values that depend only on shapes and
constants (a causal mask without padding, rotary ``cos``/``sin``, the batch size) are recomputed in
each layer that reads them rather than sent.

    >>> graph = capture_exported(GPT2LMHeadModel(config), input=fields_spec, target=TensorSpec((16,), "int64"),
    ...                          loss=LossKind.CAUSAL_LM, name="gpt2")           # doctest: +SKIP
"""

from __future__ import annotations

import copy
import inspect
import operator
from typing import Any

import torch
from torch import fx, nn
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind

from pipetrain.errors import UserError
from pipetrain.graph.capture import capture_traced
from pipetrain.graph.fx_trace import user_line
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.packing import Slot, carrier, unpack
from pipetrain.graph.training_only import modules_for_training_only_ops

__all__ = ["capture_exported", "unpack_fields"]

_EXAMPLE_BATCH = 3
"""The example batch export traces with: neither 0 nor 1 (which export specialises on), and unlike
any model dimension, so the batch stays symbolic."""

_CHECKS = frozenset({torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_scalar.default,
                     torch.ops.aten.sym_constrain_range_for_size.default})


def capture_exported(
    module: nn.Module,
    *,
    input: TensorSpec,
    target: TensorSpec,
    loss: LossKind,
    name: str,
    seed: int = 0,
) -> LayerGraph:
    """``module`` as a chain of block-sized layers, each holding the module's current weights.

    Args:
        module: a module whose ``forward`` takes the keyword tensors ``input.fields`` names and
            returns a tensor or a ``ModelOutput`` / dict with ``logits``.
        input: the packed per-sample spec of the keyword inputs (``input.fields``: name, shape, dtype each).
        target, loss, name, seed: as :func:`pipetrain.graph.capture.capture`.

    Raises:
        UserError: ``torch.export`` fails (one line: what failed, where, and the fix), or the model
            returns no tensor to train on.
    """
    if not input.fields:
        raise UserError(f"model {name!r}: capture_exported needs the names of the keyword inputs (TensorSpec.fields)")
    root = copy.deepcopy(module).train()
    config: Any = getattr(root, "config", None)
    if getattr(config, "use_cache", None):
        config.use_cache = False  # a KV cache is for generation; training returns no cache
    _check_vocabulary(config, input, name)
    program = _export(root, input, name)
    graph = _single_input_graph(root, program, input)
    _pick_output(graph, program, name)
    modules_for_training_only_ops(root, graph)
    traced = fx.GraphModule(root, graph)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    return capture_traced(root, traced, input=input, target=target, loss=loss, name=name, seed=seed)


def unpack_fields(x: torch.Tensor, slots: tuple[Slot, ...]) -> tuple[torch.Tensor, ...]:
    """The keyword inputs packed in ``x`` (``[b, n]``), one ``[b, *slot.shape]`` each: the captured
    graph's first operation. It reads nothing of ``x`` but its batch size, so fx can trace it again
    when a pickled layer is rebuilt."""
    return unpack(x, slots, carrier([slot.dtype for slot in slots]))


def _export(root: nn.Module, input: TensorSpec, name: str) -> ExportedProgram:
    """``torch.export`` of ``root`` on example keyword inputs of a dynamic batch size."""
    examples = {field.name: torch.ones((_EXAMPLE_BATCH, *field.shape), dtype=field.torch_dtype)
                for field in input.fields}
    unknown = [f.name for f in input.fields if not _takes(root, f.name)]
    if unknown:
        raise UserError(f"model {name!r} has no forward input {', '.join(map(repr, unknown))} that the data gives; "
                        "drop those keys from the dataset's items (keep 'labels' for the target)")
    batch = Dim("batch", min=1)
    try:
        return torch.export.export(root, (), examples, dynamic_shapes={k: {0: batch} for k in examples}, strict=False)
    except Exception as error:
        what = " ".join(str(error).split()).split(". ")[0][:240]
        raise UserError(
            f"torch.export cannot capture {name!r} at {user_line(error)}: {type(error).__name__}: {what}; make that "
            "line work for a batch of any size without a Python branch on a tensor's values (torch.where), or give "
            "the data as (input, target) tensor pairs so that pipetrain traces the model with torch.fx, where "
            "--leaf keeps a module whole"
        ) from None


def _check_vocabulary(config: Any, input: TensorSpec, name: str) -> None:
    """Raises UserError: token ids of the data (``input.high``) past a Hugging Face config's ``vocab_size``."""
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and input.high is not None and input.high > vocab:
        raise UserError(f"the data's token ids reach {input.high - 1} but model {name!r} has a vocabulary of {vocab}; "
                        "tokenise with the model's tokenizer (--tokenizer module.path:callable) or give the model "
                        f"vocab_size >= {input.high}")


def _takes(root: nn.Module, keyword: str) -> bool:
    params = inspect.signature(root.forward).parameters
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _single_input_graph(root: nn.Module, program: ExportedProgram, input: TensorSpec) -> fx.Graph:
    """The exported graph with weights as ``get_attr`` of their names and the keyword inputs unpacked
    from one placeholder."""
    graph: fx.Graph = copy.deepcopy(program.graph_module.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = placeholders[0]
    with graph.inserting_before(first):
        packed = graph.placeholder("x")
    with graph.inserting_after(packed):
        slots = tuple(Slot(f.shape, f.torch_dtype) for f in input.fields)
        fields = graph.call_function(unpack_fields, (packed, slots))
    users = 0
    for spec, node in zip(program.graph_signature.input_specs, placeholders, strict=True):
        if spec.kind is InputKind.USER_INPUT:
            with graph.inserting_after(fields):
                replacement = graph.call_function(operator.getitem, (fields, users))
            users += 1
        else:
            replacement = _weight(root, program, graph, spec.kind, str(spec.target), node)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in _CHECKS]:
        graph.erase_node(node)
    _drop_placeholder_modules(graph, root)
    return graph


def _drop_placeholder_modules(graph: fx.Graph, root: nn.Module) -> None:
    """Remove the entries of each node's module stack that name no module of ``root`` (export's
    stand-ins for nodes made outside any module's forward), so a stack ends at the real innermost module."""
    real = {path for path, _ in root.named_modules(remove_duplicate=False)}
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {key: value for key, value in stack.items() if value[0] in real}


def _weight(root: nn.Module, program: ExportedProgram, graph: fx.Graph, kind: InputKind, target: str,
            node: fx.Node) -> fx.Node:
    """A ``get_attr`` of a lifted parameter, buffer or constant, inserted where the placeholder was."""
    if kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
        attribute = f"_pipetrain_constant_{target.replace('.', '_')}"
        value = program.constants[target]
        if isinstance(value, torch.Tensor):
            root.register_buffer(attribute, value, persistent=False)  # moves with .to(), is not saved
        else:
            setattr(root, attribute, value)
        target = attribute
    with graph.inserting_before(node):
        return graph.get_attr(target)


def _pick_output(graph: fx.Graph, program: ExportedProgram, name: str) -> None:
    """Make the graph return the one tensor the loss takes: ``logits`` of a ``ModelOutput`` or dict,
    else the only output."""
    output = next(n for n in graph.nodes if n.op == "output")
    leaves: list[Any] = list(output.args[0]) if isinstance(output.args[0], tuple | list) else [output.args[0]]
    user = leaves[len(leaves) - len(program.graph_signature.user_outputs):]
    spec = program.call_spec.out_spec
    keys = list(spec.context) if spec is not None and isinstance(spec.context, list) else []
    if "logits" in keys and len(keys) == len(user):
        chosen = user[keys.index("logits")]
    elif len(user) == 1:
        chosen = user[0]
    else:
        raise UserError(f"model {name!r} returns {len(user)} values ({', '.join(map(str, keys)) or 'unnamed'}) and "
                        "none is 'logits'; return the tensor the loss takes (wrap the module if needed)")
    if not isinstance(chosen, fx.Node):
        raise UserError(f"model {name!r} returns no tensor to train on; return the logits")
    output.args = (chosen,)
