"""Operations that behave differently in training, as modules again, in an exported graph.

``torch.export`` traces a model once, in training mode, and records what ran: ``aten.dropout(x, 0.1,
True)``, ``aten.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.1)``. Run later in
evaluation (``model.eval()``: held-out loss, forward-only plans), they would still drop. So each
becomes a call of a module whose ``training`` flag decides, as in the original model:

* ``aten.dropout`` → the ``nn.Dropout`` it ran in when it ran in one with that ``p``, else a new
  ``nn.Dropout(p)``;
* an attention with ``dropout_p > 0`` → :class:`AttentionDropout` (``p`` in training, 0 otherwise);
* ``aten.batch_norm(x, weight, bias, mean, var, True, …)`` and the ``num_batches_tracked += 1``
  beside it → the ``BatchNorm`` module it ran in, which normalises by the batch and updates its
  running statistics in training, and uses them in evaluation.

A new module is held by the module whose ``forward`` made the call (``transformer.h.0.attn``), so
it stays in that block's layer; it has no state, so ``state_dict`` keys do not change.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["AttentionDropout", "modules_for_training_only_ops"]

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_BATCH_NORM = torch.ops.aten.batch_norm.default
_DROPOUT_P = 4  # position of dropout_p in aten.scaled_dot_product_attention's schema


class AttentionDropout(nn.Module):
    """``scaled_dot_product_attention(q, k, v, …)`` with dropout ``p`` in training and none in evaluation."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``args``/``kwargs``: the attention's, without ``dropout_p``."""
        return _SDPA(*args, dropout_p=self.p if self.training else 0.0, **kwargs)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"p={self.p}"


def modules_for_training_only_ops(root: nn.Module, graph: fx.Graph) -> None:
    """Rewrite ``graph``'s dropouts and attention dropouts as module calls (module docstring); new
    modules are added to ``root``."""
    made = 0
    for node in list(graph.nodes):
        if node.target is torch.ops.aten.dropout.default:
            x, p = node.args[0], float(node.args[1])  # type: ignore[arg-type]
            owner = _innermost(node)
            existing = root.get_submodule(owner)
            if isinstance(existing, nn.Dropout) and existing.p == p:
                _replace(graph, node, owner, (x,), {})
                continue
            _replace(graph, node, _add(root, owner, nn.Dropout(p), made), (x,), {})
            made += 1
        elif node.target is _BATCH_NORM and isinstance(root.get_submodule(_innermost(node)), _BatchNorm):
            _replace(graph, node, _innermost(node), (node.args[0],), {})
            _drop_count(graph, _innermost(node))
        elif node.target is _SDPA:
            args, kwargs = list(node.args), dict(node.kwargs)
            p = float(kwargs.pop("dropout_p", args.pop(_DROPOUT_P) if len(args) > _DROPOUT_P else 0.0))
            if p > 0:
                _replace(graph, node, _add(root, _innermost(node), AttentionDropout(p), made), tuple(args), kwargs)
                made += 1


def _drop_count(graph: fx.Graph, owner: str) -> None:
    """Erase the in-place ``num_batches_tracked`` update the module at ``owner`` now makes itself."""
    counter = f"{owner}.num_batches_tracked" if owner else "num_batches_tracked"
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.add_.Tensor and not node.users:
            source = node.args[0]
            if isinstance(source, fx.Node) and source.op == "get_attr" and source.target == counter:
                graph.erase_node(node)


def _innermost(node: fx.Node) -> str:
    """The path of the module whose forward made ``node`` (``""``: the root)."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    return str(stack[-1][0]) if stack else ""


def _add(root: nn.Module, owner: str, module: nn.Module, k: int) -> str:
    """Hold ``module`` in the module at ``owner``; its path."""
    name = f"_pipetrain_training_only_{k}"
    root.get_submodule(owner).add_module(name, module)
    return f"{owner}.{name}" if owner else name


def _replace(graph: fx.Graph, node: fx.Node, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with graph.inserting_before(node):
        call = graph.call_module(path, args, kwargs)
    call.meta = dict(node.meta)
    node.replace_all_uses_with(call)
    graph.erase_node(node)
