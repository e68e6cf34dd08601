"""Tracing a module with ``torch.fx`` and finding each node's per-sample shape, for :mod:`capture`.

:func:`trace` gives the module's ``forward`` as one fx graph of one placeholder (the input) and one
output; what fx cannot trace becomes one :class:`UserError` naming the node or operation, the
user's line and the fix. :func:`sample_parts` runs that graph on a sample of two batch sizes and
returns, per node, the value's per-sample shape and dtype (``[b, *shape]``), or why it has none.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import TensorSpec

__all__ = ["Part", "innermost_module", "sample_parts", "trace", "user_line"]

SAMPLE_BATCHES = (2, 3)
"""Batch sizes of the samples: two of them tell the batch dimension from a fixed one."""


# ---- tracing ---------------------------------------------------------------------------------


class _Untraceable(Exception):
    """A traced value used where Python needs a real one (control flow, iteration)."""

    def __init__(self, node: fx.Node, what: str) -> None:
        super().__init__(what)
        self.node = node


class _Tracer(fx.Tracer):
    """fx's tracer, keeping ``leaves`` whole and naming the node behind a data-dependent branch."""

    def __init__(self, leaves: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.leaves = leaves
        self.record_stack_traces = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, module_qualified_name)

    def to_bool(self, obj: fx.Proxy) -> bool:
        raise _Untraceable(obj.node, "decides Python control flow (if, while, and, or, bool) on a tensor's value")

    def iter(self, obj: fx.Proxy) -> Any:
        raise _Untraceable(obj.node, "iterates over a traced value of unknown length")


def trace(root: nn.Module, leaves: Sequence[type[nn.Module]], name: str) -> fx.GraphModule:
    """``root``'s forward as one GraphModule of one placeholder (the input) and one output value.

    Modules of ``torch.nn`` (other than containers) and of the ``leaves`` classes are not traced
    into: each is one ``call_module`` node. Inputs after the first are bound to their defaults.

    Raises:
        UserError: one line naming the node or operation fx failed on, the user's line, and the fix;
            ``leaves`` that are not module classes.
    """
    bad = [repr(t) for t in leaves if not (isinstance(t, type) and issubclass(t, nn.Module))]
    if bad:
        raise UserError(f"leaf modules must be nn.Module classes, not {', '.join(bad)}")
    tracer = _Tracer(tuple(leaves))
    concrete = _defaults(root, name)
    try:
        graph = tracer.trace(root, concrete_args=concrete)
    except _Untraceable as error:
        module = innermost_module(error.node.meta.get("nn_module_stack") or {})
        where = f"module {module[0]!r}" if module else "the model's own forward"
        raise UserError(
            f"torch.fx cannot capture {name!r}: node {error.node.name!r} in {where} ({user_line(error)}) {error}; "
            f"{_fix(module, name)}"
        ) from None
    except Exception as error:
        what = " ".join(str(error).split()) or type(error).__name__
        module = innermost_module(tracer.module_stack)
        where = f" in module {module[0]!r}" if module else ""
        raise UserError(
            f"torch.fx cannot capture {name!r}{where} at {user_line(error)}: {what}; {_fix(module, name)}"
        ) from None
    _drop_specialised_inputs(graph, name)
    result = next(n for n in graph.nodes if n.op == "output").args[0]
    if not isinstance(result, fx.Node):
        raise UserError(
            f"{name!r} returns a {type(result).__name__}; pipetrain captures models that return one tensor: return "
            "only the output the loss takes (wrap the module if needed)"
        )
    return fx.GraphModule(tracer.root, graph)


def innermost_module(stack: Mapping[str, Any]) -> tuple[str, type] | None:
    """``(qualified name, class)`` of the innermost module of an fx module stack; None: the root."""
    return tuple(list(stack.values())[-1]) if stack else None  # type: ignore[return-value]


def _fix(module: tuple[str, type] | None, name: str) -> str:
    if module is None:
        return f"rewrite that line of the forward of {name!r}, or pass an nn.Sequential"
    cls = module[1]
    return (f"mark {cls.__name__} a leaf, run whole inside one layer (leaf_modules=[{cls.__name__}] / "
            f"--leaf {cls.__module__}:{cls.__qualname__}), or pass an nn.Sequential")


def _defaults(root: nn.Module, name: str) -> dict[str, Any]:
    """``forward``'s parameters after the first, bound to their defaults (fx specialises on them)."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = [p for p in inspect.signature(root.forward).parameters.values() if p.kind not in variadic]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    if len(required) != 1:
        raise UserError(
            f"{name!r}.forward takes {len(required)} inputs without defaults ({', '.join(required)}); give the data "
            "as dicts of those inputs with the target under 'labels' (pipetrain then captures the model with "
            "torch.export), or give all but the first defaults"
        )
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _drop_specialised_inputs(graph: fx.Graph, name: str) -> None:
    """Remove the placeholders fx adds for defaulted inputs (all but the first), and the asserts on them."""
    for placeholder in [n for n in graph.nodes if n.op == "placeholder"][1:]:
        doomed = [placeholder]
        for node in doomed:
            doomed.extend(u for u in node.users if u not in doomed)
        if any(node.op == "output" for node in doomed):
            raise UserError(f"{name!r}'s output depends on forward's input {placeholder.target!r}; pipetrain "
                            "captures models of one input tensor for now: make the others attributes")
        for node in reversed(doomed):
            graph.erase_node(node)


def user_line(error: BaseException) -> str:
    """``model.py:12 `if x.sum() > 0:``` for the innermost frame of the user's code in ``error``'s traceback."""
    skip = (str(Path(torch.__file__).parent), str(Path(__file__).parent.parent))
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(skip)]
    if not frames:
        return "an unknown line"
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} `{(frame.line or '').strip()}`"


# ---- per-sample shapes -----------------------------------------------------------------------


class Part(NamedTuple):
    """A batched value's per-sample shape and dtype: the value is ``[b, *shape]``."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        """``float32 [b, 16]``."""
        return f"{str(self.dtype).removeprefix('torch.')} [b{''.join(f', {d}' for d in self.shape)}]"


_Value = tuple[tuple[int, ...], torch.dtype] | None  # (shape, dtype) of a tensor; None: not a tensor


class _NodeFailure(Exception):
    def __init__(self, node: fx.Node, error: Exception) -> None:
        super().__init__(str(error))
        self.node, self.error = node, error


class _Recorder(fx.Interpreter):
    """Runs the traced model node by node and records each node's value as ``(shape, dtype)``."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[fx.Node, _Value] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            value = super().run_node(n)
        except Exception as error:
            raise _NodeFailure(n, error) from error
        self.values[n] = (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None
        return value


class _Record(nn.Module):
    """``_Recorder`` as a module, so that ``functional_call`` can swap in copies of the weights."""

    def __init__(self, traced: fx.GraphModule) -> None:
        super().__init__()
        self.traced = traced

    def forward(self, x: torch.Tensor) -> dict[fx.Node, _Value]:
        recorder = _Recorder(self.traced)
        recorder.run(x)
        return recorder.values


def sample_parts(traced: fx.GraphModule, spec: TensorSpec, name: str) -> dict[fx.Node, Part | str]:
    """Each node's per-sample :class:`Part`, or why it has none (``"not a tensor"``, ``"not batched
    along dim 0"``).

    Runs the model on zero inputs ``[b, *spec.shape]`` for each of :data:`SAMPLE_BATCHES`: on fake
    tensors (no compute, no memory) or, where an operation cannot run on them (a shape that depends
    on values), on real ones. The module's own weights and buffers are never changed.

    Raises:
        UserError: the model fails on the sample (e.g. the data's shape does not fit it).
    """
    runs = [_values(traced, torch.zeros((b, *spec.shape), dtype=spec.torch_dtype), name) for b in SAMPLE_BATCHES]
    parts: dict[fx.Node, Part | str] = {}
    for node, value in runs[0].items():
        other = runs[1][node]
        if value is None or other is None:
            parts[node] = "not a tensor"
        elif value[0][:1] == SAMPLE_BATCHES[:1] and other[0] == (SAMPLE_BATCHES[1], *value[0][1:]):
            parts[node] = Part(value[0][1:], value[1])
        else:
            parts[node] = "not batched along dim 0"
    return parts


def _values(traced: fx.GraphModule, x: torch.Tensor, name: str) -> dict[fx.Node, _Value]:
    """Each node's ``(shape, dtype)`` for input ``x``: with fake weights, else with copies of the real ones."""
    record = _Record(traced)
    state = dict(record.named_parameters()) | dict(record.named_buffers())
    try:
        try:
            with _quiet("torch._subclasses.fake_tensor"), FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake: dict[str, torch.Tensor] = {k: mode.from_tensor(v) for k, v in state.items()}
                return torch.func.functional_call(record, fake, (mode.from_tensor(x),))  # type: ignore[no-any-return]
        except _NodeFailure:  # e.g. .item() or an output shape that depends on values
            with torch.no_grad():
                real = {k: v.detach().clone() for k, v in state.items()}
                return torch.func.functional_call(record, real, (x,))  # type: ignore[no-any-return]
    except _NodeFailure as failure:
        what = " ".join(str(failure.error).split())
        raise UserError(
            f"running {name!r} on a sample input {Part(tuple(x.shape[1:]), x.dtype)} failed at node "
            f"{failure.node.name!r} ({failure.node.op} {failure.node.target}): {type(failure.error).__name__}: "
            f"{what}; check that the data's input shape and dtype fit the model"
        ) from None


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Silence ``logger`` (fake tensors log every operation they cannot run before raising)."""
    log = logging.getLogger(logger)
    disabled, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = disabled
