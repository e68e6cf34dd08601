"""Tied weights across stages: every copy's gradient is the sum over all copies before the step.

A tied tensor (:mod:`pipetrain.graph.ties`) whose layers sit on several stages has a copy in each of
them, all with the model's one initial value. Before the step, each copy's gradient becomes the sum
of every copy's: first over the copies on this rank (two stages of a looping or V placement), then
with one all-reduce over the tie's *owners*, every rank of every stage holding it, replicas
included (a process group made at setup per tie, :func:`tie_groups`). Every copy then takes the
same step from the same value, so training equals single-process, as Megatron trains its embedding
and head (docs/architecture.md §6). Ties whose layers share one stage were made one tensor when the
stage was built and need nothing here.

A replicated stage leaves its tied parameters out of the replicas' all-reduce (the owners' sum
covers every replica), and clipping counts each copy ``1 / copies`` of its squared norm
(:meth:`TiedGradients.copies`), so the tensor counts once in the global norm.

The sum runs at the rank's first STEP of the step, after every backward of its stages: the method
must flush each batch and pass gradients between stages (:func:`check_ties`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph
from pipetrain.graph.ties import Tie
from pipetrain.plan.methods import methods_where
from pipetrain.plan.plan import Plan

__all__ = ["TiedCopies", "TiedGradients", "check_ties", "spanning_ties", "tie_groups"]


def _holders(plan: Plan, tie: Tie) -> tuple[int, ...]:
    """The stages holding a layer of ``tie``."""
    return tuple(k for k, s in enumerate(plan.stages) if set(s.layers) & set(tie.layers))


def spanning_ties(graph: LayerGraph, plan: Plan) -> tuple[tuple[Tie, tuple[int, ...]], ...]:
    """The graph's ties held by two or more stages of ``plan``, with those stages."""
    return tuple((tie, stages) for tie in graph.ties if len(stages := _holders(plan, tie)) > 1)


def _owners(plan: Plan, stages: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({r for k in stages for r in plan.stages[k].ranks}))


def check_ties(graph: LayerGraph, plan: Plan) -> None:
    """Raises UserError when a tie spans stages under a method that cannot sum its gradients: one
    that steps stages at different moments (no flush: weight versions) or keeps gradients in their
    stage (local learning)."""
    spec = plan.spec
    if spec.flush and spec.gradients_cross_stages:
        return
    synchronous = ", ".join(m.value for m in methods_where(flush=True, gradients_cross_stages=True))
    for tie, stages in spanning_ties(graph, plan):
        raise UserError(f"{tie.name} is tied to {', '.join(tie.names[1:])} (layers {', '.join(tie.layers)}) on stages "
                        f"{list(stages)}, which method {plan.method.value} cannot keep equal; put those layers in one "
                        f"stage, or use a synchronous method ({synchronous})")


def tie_groups(graph: LayerGraph, plan: Plan) -> dict[Tie, dist.ProcessGroup]:
    """The process group of each spanning tie's owner ranks (when more than one rank). Every rank of
    the launch calls this, in the same order (``dist.new_group`` is collective)."""
    groups = {}
    for tie, stages in spanning_ties(graph, plan):
        owners = _owners(plan, stages)
        if len(owners) > 1:
            groups[tie] = dist.new_group(list(owners))
    return groups


@dataclass(frozen=True)
class TiedCopies:
    """One tie's copies on this rank.

    Attributes:
        tie: the tie.
        params: this rank's copies (one per stage of the rank holding it).
        group: the owners' process group; None when this rank is the only owner.
        copies: how many copies the plan holds (one per rank of each holding stage).
    """

    tie: Tie
    params: tuple[nn.Parameter, ...]
    group: dist.ProcessGroup | None
    copies: int


class TiedGradients:
    """Sums the gradients of the tied parameters a rank holds over all their copies (module docstring)."""

    def __init__(self, ties: Sequence[TiedCopies]) -> None:
        self.ties = tuple(ties)
        self._ids = frozenset(id(p) for t in self.ties for p in t.params)

    @classmethod
    def build(cls, graph: LayerGraph, plan: Plan, modules: Mapping[int, nn.Module],
              groups: Mapping[Tie, dist.ProcessGroup]) -> TiedGradients:
        """This rank's tied parameters, from its stage modules by stage (children: the stage's layers
        in order) and :func:`tie_groups`."""
        found = []
        for tie, stages in spanning_ties(graph, plan):
            params = [p for k in stages if k in modules
                      for p in _copies(tie, graph.layers_named(plan.stages[k].layers), modules[k])]
            if params:
                copies = sum(len(plan.stages[k].ranks) for k in stages)
                found.append(TiedCopies(tie, tuple(params), groups.get(tie), copies))
        return cls(found)

    def __bool__(self) -> bool:
        return bool(self.ties)

    def holds(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is a copy of a tied parameter (left out of the replicas' all-reduce)."""
        return id(p) in self._ids

    def copies(self) -> dict[int, int]:
        """How many copies the plan holds of each tied parameter of this rank, by ``id`` (clipping)."""
        return {id(p): t.copies for t in self.ties for p in t.params}

    def sum_gradients(self) -> None:
        """Every copy's gradient ← the sum over all copies: on this rank, then over the owners."""
        for tied in self.ties:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in tied.params]
            total = grads[0].clone()
            for g in grads[1:]:
                total += g
            if tied.group is not None:
                dist.all_reduce(total, group=tied.group)
            for p in tied.params:
                p.grad = total.clone()


def _copies(tie: Tie, layers: Sequence[Layer], module: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters of ``module`` (a stage: one child per layer of ``layers``) that are
    copies of ``tie``, each once (a stage holding several users holds one, :func:`~pipetrain.graph.ties.retie`)."""
    out: list[nn.Parameter] = []
    for layer, child in zip(layers, module.children(), strict=True):
        if layer.name not in tie.layers:
            continue
        for key, p in child.named_parameters(remove_duplicate=False):
            if layer.qualified(key) in tie.names and p.requires_grad and all(p is not q for q in out):
                out.append(p)
    return out
