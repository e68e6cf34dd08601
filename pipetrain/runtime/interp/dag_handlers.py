"""The handlers of a stage in a DAG of stages (method ``graph``, GraphPipe, Jeon et al. 2025, §3.4).

The interpreter (:mod:`pipetrain.runtime.interp.executor`) sends F, B and the communication actions here
when its rank's context has a :class:`DagStage`. A stage has one port per neighbouring stage
(:mod:`pipetrain.graph.dataflow`): it receives from each predecessor ``p`` the values of ``p``'s
layers it reads, packed into one tensor ``[b, n_p]``, and sends each successor ``t`` those it reads.
A stage with source layers also reads the model input. Per micro-batch ``[lo, hi)`` of ``b`` samples::

    RECV_F<p  x_p [b, n_p] from predecessor p, stored by range (re-chunked like a chain's)
    F         ys = stage(x_in [b, *in], x_p1, x_p2, ...)   one output per successor;
              the last stage: y = loss(y, targets) / B; keep (xs, ys)
    SEND_F>t  y_t [b, m_t], detached
    RECV_B<t  dy_t [b, m_t] from successor t
    B         backward(ys, (dy_t1, dy_t2, ...)): a value that two successors read gets the sum of
              their gradients, since autograd sums over the packed copies; keep x_p.grad per p
    SEND_B>p  x_p.grad [b, n_p]

STEP, replicas, clipping and evaluation's tally are the executor's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pipetrain.graph.dataflow import MODEL_INPUT, Port, port_spec
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.schedule.action import ActionKind

if TYPE_CHECKING:
    from pipetrain.runtime.interp.executor import RankContext
    from pipetrain.schedule.action import Action

__all__ = ["DagStage", "dag_backward", "dag_forward", "dag_message_spec", "dag_ports", "dag_recv", "dag_send"]

Range = tuple[int, int]


def dag_ports(graph: LayerGraph, plan: Plan, stage: int) -> tuple[list[Port], list[Port]]:
    """``stage``'s input ports (the model input first if it reads it, then one per predecessor) and
    output ports (one per successor; the last stage: the model's output)."""
    index = {name: i for i, name in enumerate(graph.names)}
    mine = {index[n] for n in plan.stages[stage].layers}

    def carried(src: set[int], dst: set[int]) -> Port:
        return tuple(sorted(i for i in src if dst.intersection(graph.successors(i))))

    def layers_of(k: int) -> set[int]:
        return {index[n] for n in plan.stages[k].layers}

    inputs: list[Port] = [(MODEL_INPUT,)] if any(not graph.predecessors(i) for i in mine) else []
    inputs += [carried(layers_of(p), mine) for p in plan.stage_predecessors(stage)]
    outputs = [carried(mine, layers_of(t)) for t in plan.stage_successors(stage)] or [(len(graph) - 1,)]
    return inputs, outputs


@dataclass
class DagStage:
    """A rank's state for its stage in a DAG of stages.

    Attributes:
        reads_input: the stage has source layers (it loads the model input).
        preds / succs: neighbouring stages, in port order.
        in_specs / out_specs: per-sample spec of the packed message from each predecessor / to each successor.
        stage_of_rank: the stage each rank runs (a message's peer rank names its port).
    """

    reads_input: bool
    preds: tuple[int, ...]
    succs: tuple[int, ...]
    in_specs: dict[int, TensorSpec]
    out_specs: dict[int, TensorSpec]
    stage_of_rank: tuple[int, ...]
    inputs: dict[int, ChunkBuffer] = field(default_factory=dict)
    outputs: dict[int, ChunkBuffer] = field(default_factory=dict)
    output_grads: dict[int, ChunkBuffer] = field(default_factory=dict)
    input_grads: dict[int, ChunkBuffer] = field(default_factory=dict)
    saved: dict[Range, tuple[list[torch.Tensor], list[torch.Tensor]]] = field(default_factory=dict)

    @classmethod
    def build(cls, graph: LayerGraph, plan: Plan, stage: int) -> DagStage:
        inputs, outputs = dag_ports(graph, plan, stage)
        reads = inputs[:1] == [(MODEL_INPUT,)]
        preds, succs = plan.stage_predecessors(stage), plan.stage_successors(stage)
        made = graph.output_specs()  # one meta pass for every port's spec
        dag = cls(reads, preds, succs,
                  dict(zip(preds, (port_spec(graph, p, made) for p in inputs[reads:]), strict=True)),
                  dict(zip(succs, (port_spec(graph, p, made) for p in outputs), strict=False)), plan.rank_stages)
        for label, buffers, peers in (("input activations", dag.inputs, preds), ("outputs", dag.outputs, succs),
                                      ("output gradients", dag.output_grads, succs),
                                      ("input gradients", dag.input_grads, preds)):
            buffers.update({k: ChunkBuffer(f"{label} of stage {k}") for k in peers})
        return dag

    @property
    def buffers(self) -> tuple[ChunkBuffer, ...]:
        return (*self.inputs.values(), *self.outputs.values(), *self.output_grads.values(), *self.input_grads.values())


def _stage_inputs(ctx: RankContext, dag: DagStage, a: Action) -> list[torch.Tensor]:
    """The model input (if the stage reads it) and each predecessor's message for ``[lo, hi)``."""
    xs = [ctx.inputs.take(a.lo, a.hi)] if dag.reads_input else []
    for p in dag.preds:
        x = dag.inputs[p].take(a.lo, a.hi)
        xs.append(x.detach().requires_grad_(True) if x.is_floating_point() and torch.is_grad_enabled() else x)
    return xs


def _outputs(y: torch.Tensor | tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [y] if isinstance(y, torch.Tensor) else list(y)


def dag_forward(ctx: RankContext, dag: DagStage, a: Action) -> None:
    """F: run the stage on every port's ``[lo, hi)``; keep ``(xs, ys)``; store each successor's output."""
    if ctx.evaluation is not None:
        with torch.no_grad():
            ys = _outputs(ctx.module(*_stage_inputs(ctx, dag, a)))
        if ctx.is_last:
            assert ctx.targets is not None, "begin_step loads the last stage's targets"
            ctx.evaluation.add(ctx.loss, ys[0], ctx.targets[a.lo:a.hi])
            return
        for t, y in zip(dag.succs, ys, strict=True):
            dag.outputs[t].put(a.lo, a.hi, y)
        return
    xs = _stage_inputs(ctx, dag, a)
    with ctx.meter.track((a.lo, a.hi)):
        ys = _outputs(ctx.module(*xs))
    if ctx.is_last:
        if ctx.targets is None:
            raise ValueError("the last stage has no targets; call begin_step first")
        loss = ctx.loss(ys[0], ctx.targets[a.lo:a.hi]) / ctx.batch_size
        ys = [loss]
        ctx.loss_total = loss.detach() if ctx.loss_total is None else ctx.loss_total + loss.detach()
        ctx.loss_count += 1
    else:
        for t, y in zip(dag.succs, ys, strict=True):
            dag.outputs[t].put(a.lo, a.hi, y.detach())
    dag.saved[(a.lo, a.hi)] = (xs, ys)


def dag_backward(ctx: RankContext, dag: DagStage, a: Action) -> None:
    """B: back-propagate every output's gradient at once; keep each predecessor's input gradient."""
    key = (a.lo, a.hi)
    if key not in dag.saved:
        raise ValueError(f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {sorted(dag.saved)})")
    xs, ys = dag.saved.pop(key)
    if ctx.is_last:
        torch.autograd.backward(ys)
    else:
        grads = [dag.output_grads[t].take(*key) for t in dag.succs]
        pairs = [(y, g) for y, g in zip(ys, grads, strict=True) if y.requires_grad]
        if pairs:
            torch.autograd.backward([y for y, _ in pairs], [g for _, g in pairs])
    ctx.meter.release(key)
    for p, x in zip(dag.preds, xs[dag.reads_input:], strict=True):
        dag.input_grads[p].put(*key, x.grad if x.grad is not None else torch.zeros_like(x))


def dag_message_spec(dag: DagStage, a: Action) -> TensorSpec:
    """The per-sample spec of what a communication action moves (activations and their gradients alike)."""
    assert a.peer is not None
    peer = dag.stage_of_rank[a.peer]
    forward_side = a.kind in (ActionKind.SEND_F, ActionKind.RECV_B)  # toward a successor
    return dag.out_specs[peer] if forward_side else dag.in_specs[peer]


def dag_send(ctx: RankContext, dag: DagStage, a: Action) -> torch.Tensor:
    """What SEND_F (the successor's output) or SEND_B (the predecessor's input gradient) sends."""
    assert a.peer is not None
    peer = dag.stage_of_rank[a.peer]
    source = dag.outputs[peer] if a.kind is ActionKind.SEND_F else dag.input_grads[peer]
    return source.take(a.lo, a.hi)


def dag_recv(dag: DagStage, a: Action, tensor: torch.Tensor) -> None:
    """Store what RECV_F (a predecessor's activations) or RECV_B (a successor's gradient) received."""
    assert a.peer is not None
    peer = dag.stage_of_rank[a.peer]
    target = dag.inputs[peer] if a.kind is ActionKind.RECV_F else dag.output_grads[peer]
    target.put(a.lo, a.hi, tensor)
