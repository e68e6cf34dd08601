"""The stage kernel of a stage in a DAG of stages (method ``graph``, GraphPipe, Jeon et al. 2025, §3.4).

A stage has one port per neighbouring stage (:mod:`pipetrain.graph.dataflow`): it receives from each
predecessor ``p`` the values of ``p``'s layers it reads, packed into one tensor ``[b, n_p]``, and sends
each successor ``t`` those it reads. A stage with source layers also reads the model input. Per
micro-batch ``[lo, hi)`` of ``b`` samples::

    RECV_F<p  x_p [b, n_p] from predecessor p, stored by range (re-chunked like a chain's)
    F         ys = stage(x_in [b, *in], x_p1, x_p2, ...)   one output per successor;
              the last stage: y = loss(y, targets) / B; keep (xs, ys)
    SEND_F>t  y_t [b, m_t], detached
    RECV_B<t  dy_t [b, m_t] from successor t
    B         backward(ys, (dy_t1, dy_t2, ...)): a value that two successors read gets the sum of
              their gradients, since autograd sums over the packed copies; keep x_p.grad per p
    SEND_B>p  x_p.grad [b, n_p]
    STEP      as a chain's synchronous step (:mod:`pipetrain.runtime.interp.step`)

A stage that recomputes (:meth:`~pipetrain.plan.plan.Plan.recomputes`) runs F without autograd and
keeps only ``(x_in, x_p1, ...)`` and the random generators' states; its B first re-runs F on them with
autograd (drawing what F drew, under the autocast F ran in), then back-propagates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pipetrain.graph.dataflow import MODEL_INPUT, Port, port_spec
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.backward import missing_backward
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.runtime.interp.context import Range, RankContext, stage_outputs
from pipetrain.runtime.interp.keeping import buffers_kept
from pipetrain.runtime.interp.rng_replay import RngState
from pipetrain.runtime.interp.step import check_consumed, optimizer_step
from pipetrain.schedule.action import Action, ActionKind

__all__ = ["DagKernel", "DagPorts", "dag_ports"]


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


def _by_stage(label: str, stages: Sequence[int]) -> dict[int, ChunkBuffer]:
    return {k: ChunkBuffer(f"{label} of stage {k}") for k in stages}


@dataclass
class DagPorts:
    """A DAG stage's messages, one buffer per neighbouring stage and direction.

    Attributes:
        reads_input: the stage has source layers (it loads the model input into ``model_input``).
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
    model_input: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("input activations"))
    inputs: dict[int, ChunkBuffer] = field(default_factory=dict)
    outputs: dict[int, ChunkBuffer] = field(default_factory=dict)
    output_grads: dict[int, ChunkBuffer] = field(default_factory=dict)
    input_grads: dict[int, ChunkBuffer] = field(default_factory=dict)

    @classmethod
    def build(cls, graph: LayerGraph, plan: Plan, stage: int) -> DagPorts:
        inputs, outputs = dag_ports(graph, plan, stage)
        reads = inputs[:1] == [(MODEL_INPUT,)]
        preds, succs = plan.stage_predecessors(stage), plan.stage_successors(stage)
        made = graph.output_specs()  # one meta pass for every port's spec
        return cls(reads, preds, succs,
                   dict(zip(preds, (port_spec(graph, p, made) for p in inputs[reads:]), strict=True)),
                   dict(zip(succs, (port_spec(graph, p, made) for p in outputs), strict=False)), plan.rank_stages,
                   inputs=_by_stage("input activations", preds), outputs=_by_stage("outputs", succs),
                   output_grads=_by_stage("output gradients", succs),
                   input_grads=_by_stage("input gradients", preds))

    @property
    def buffers(self) -> tuple[ChunkBuffer, ...]:
        return (self.model_input, *self.inputs.values(), *self.outputs.values(), *self.output_grads.values(),
                *self.input_grads.values())

    def spec(self, a: Action) -> TensorSpec:
        """Activations and their gradients alike: the successor's port toward it (SEND_F, RECV_B), else
        the predecessor's."""
        assert a.peer is not None
        peer = self.stage_of_rank[a.peer]
        return self.out_specs[peer] if a.kind in (ActionKind.SEND_F, ActionKind.RECV_B) else self.in_specs[peer]

    def buffer(self, a: Action) -> ChunkBuffer:
        assert a.peer is not None
        by_kind = {ActionKind.RECV_F: self.inputs, ActionKind.SEND_F: self.outputs,
                   ActionKind.RECV_B: self.output_grads, ActionKind.SEND_B: self.input_grads}
        return by_kind[a.kind][self.stage_of_rank[a.peer]]

    def gather(self, a: Action) -> list[torch.Tensor]:
        xs = [self.model_input.take(a.lo, a.hi)] if self.reads_input else []
        for p in self.preds:
            x = self.inputs[p].take(a.lo, a.hi)
            xs.append(x.detach().requires_grad_(True) if x.is_floating_point() and torch.is_grad_enabled() else x)
        return xs

    def scatter(self, a: Action, outputs: Sequence[torch.Tensor]) -> None:
        for t, y in zip(self.succs, outputs, strict=True):
            self.outputs[t].put(a.lo, a.hi, y)

    def clear(self) -> None:
        for buffer in self.buffers:
            buffer.clear()


class DagKernel:
    """A DAG stage's F, B and STEP (module docstring); it has no split backward.

    Args:
        ports: its messages.
        recompute: F keeps only the stage's inputs (no autograd graph) and B re-runs the stage on
            them first (:meth:`~pipetrain.plan.plan.Plan.recomputes`; as a chain's
            :class:`~pipetrain.runtime.interp.keeping.Recompute`, BatchNorm statistics updated once).
    """

    head: nn.Module | None = None
    targets_everywhere = False

    def __init__(self, ports: DagPorts, recompute: bool = False) -> None:
        self.ports = ports
        self.recompute = recompute
        self.saved: dict[Range, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self.stashed: dict[Range, tuple[list[torch.Tensor], RngState]] = {}

    def begin_step(self, ctx: RankContext, inputs: torch.Tensor | None) -> None:
        self.ports.clear()
        self.saved.clear()
        self.stashed.clear()

    def _run(self, ctx: RankContext, a: Action, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The stage's outputs on ``xs``; the last stage's is its weighted loss."""
        ys = stage_outputs(ctx.module(*xs))
        return [ctx.tally.weighted(ys[0], a)] if ctx.is_last else ys

    def forward(self, ctx: RankContext, a: Action) -> None:
        """F: run the stage on every port's ``[lo, hi)``; keep ``(xs, ys)`` (recomputing: only ``xs``);
        store each successor's output."""
        key = (a.lo, a.hi)
        if self.recompute:
            with torch.no_grad():
                xs = self.ports.gather(a)
                state = RngState.now(ctx.transport.device)
                ys = self._run(ctx, a, xs)
            self.stashed[key] = xs, state
            ctx.meter.add(sum(x.nbytes for x in xs))
        else:
            xs = self.ports.gather(a)
            with ctx.meter.track(key):
                ys = self._run(ctx, a, xs)
            self.saved[key] = (xs, ys)
        if ctx.is_last:
            ctx.tally.add(ys[0])
        else:
            self.ports.scatter(a, [y.detach() for y in ys])

    def _restore(self, ctx: RankContext, a: Action) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(xs, ys)`` of the F of ``[lo, hi)``: as kept, or re-run from the stashed inputs."""
        key = (a.lo, a.hi)
        if key in self.saved:
            return self.saved.pop(key)
        if key not in self.stashed:
            kept = sorted(self.saved) + sorted(self.stashed)
            raise ValueError(f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {kept})")
        stashed, state = self.stashed.pop(key)
        ctx.meter.add(-sum(x.nbytes for x in stashed))
        reads = self.ports.reads_input
        xs = stashed[:reads] + [x.detach().requires_grad_(True) if x.is_floating_point() else x
                                for x in stashed[reads:]]
        with ctx.meter.track(key), buffers_kept(ctx.module), ctx.precision.autocast(), state.replayed():
            return xs, self._run(ctx, a, xs)

    def backward(self, ctx: RankContext, a: Action) -> None:
        """B: back-propagate every output's gradient at once; keep each predecessor's input gradient."""
        key = (a.lo, a.hi)
        xs, ys = self._restore(ctx, a)
        if ctx.is_last:
            torch.autograd.backward(ys)
        else:
            grads = [self.ports.output_grads[t].take(*key) for t in self.ports.succs]
            pairs = [(y, g) for y, g in zip(ys, grads, strict=True) if y.requires_grad]
            if pairs:
                torch.autograd.backward([y for y, _ in pairs], [g for _, g in pairs])
        ctx.meter.release(key)
        for p, x in zip(self.ports.preds, xs[self.ports.reads_input:], strict=True):
            self.ports.input_grads[p].put(*key, x.grad if x.grad is not None else torch.zeros_like(x))

    def weight(self, ctx: RankContext, a: Action) -> None:
        raise missing_backward(a)

    def step(self, ctx: RankContext, a: Action) -> None:  # the job waits for the sends after the program
        optimizer_step(ctx)
        check_consumed(a, self.ports.buffers, self.held())

    def held(self) -> dict[str, list[Range]]:
        kept = {"forwards": sorted(self.saved)} if self.saved else {}
        return kept | ({"stashed inputs": sorted(self.stashed)} if self.stashed else {})
