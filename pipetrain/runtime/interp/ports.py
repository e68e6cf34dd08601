"""The messages of a stage in a chain: one buffer per direction and side, keyed by sample range.

A chain stage receives its input activations from its predecessor (``RECV_F``, or stage 0: the model
input, loaded by :meth:`~pipetrain.runtime.interp.context.RankContext.begin_step`), sends its outputs
to its successor (``SEND_F``), receives the gradients of its outputs (``RECV_B``) and sends those of its
inputs (``SEND_B``); every message carries ``[hi - lo, *spec]`` for its action's range, re-chunked
by :class:`~pipetrain.runtime.interp.buffers.ChunkBuffer`::

    RECV_F  x  [b, *in]   -> inputs          SEND_F  outputs      -> y  [b, *out]
    RECV_B  dy [b, *out]  -> output_grads    SEND_B  input_grads  -> dx [b, *in]

Two neighbouring stages on one rank (ZB-V's stages ``R − 1`` and ``R``,
:attr:`~pipetrain.plan.plan.Plan.local_edges`) exchange no message: the successor's ports are built
:meth:`~ChainPorts.after` the predecessor's, so its input buffer *is* the predecessor's output
buffer (the predecessor's F puts ``y``, the successor's F takes it as ``x``) and its input-gradient
buffer the predecessor's output-gradient buffer (its B puts ``dx``, the predecessor's B takes ``dy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pipetrain.graph.layer_graph import TensorSpec
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.schedule.action import Action, ActionKind

__all__ = ["ChainPorts"]


@dataclass
class ChainPorts:
    """A chain stage's message buffers and the per-sample specs of what crosses its two boundaries.

    Attributes:
        input_spec / output_spec: per-sample specs of the tensors entering and leaving the stage.
        reads_input: stage 0: its inputs are the model input.
        inputs: input activations by range (stage 0: the loaded batch).
        outputs: output activations waiting for SEND_F.
        output_grads: received gradients of the outputs, waiting for B.
        input_grads: gradients of the inputs, waiting for SEND_B.
    """

    input_spec: TensorSpec
    output_spec: TensorSpec
    reads_input: bool
    inputs: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("input activations"))
    outputs: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("output activations"))
    output_grads: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("output gradients"))
    input_grads: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("input gradients"))

    @classmethod
    def after(cls, predecessor: ChainPorts, input_spec: TensorSpec, output_spec: TensorSpec) -> ChainPorts:
        """The ports of the predecessor's successor on the same rank, sharing the two buffers between
        them (module docstring)."""
        return cls(input_spec, output_spec, False, inputs=predecessor.outputs, input_grads=predecessor.output_grads)

    @property
    def model_input(self) -> ChunkBuffer:
        return self.inputs

    @property
    def buffers(self) -> tuple[ChunkBuffer, ...]:
        return self.inputs, self.outputs, self.output_grads, self.input_grads

    def spec(self, a: Action) -> TensorSpec:
        """An activation on the forward channel, a gradient on the backward: the input's spec for what
        crosses the stage's input boundary (RECV_F, SEND_B), the output's for the other (SEND_F, RECV_B)."""
        return self.input_spec if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B) else self.output_spec

    def buffer(self, a: Action) -> ChunkBuffer:
        return {ActionKind.RECV_F: self.inputs, ActionKind.SEND_F: self.outputs,
                ActionKind.RECV_B: self.output_grads, ActionKind.SEND_B: self.input_grads}[a.kind]

    def gather(self, a: Action) -> list[torch.Tensor]:
        return [self.inputs.take(a.lo, a.hi)]

    def scatter(self, a: Action, outputs: Sequence[torch.Tensor]) -> None:
        (y,) = outputs
        self.outputs.put(a.lo, a.hi, y)

    def clear(self) -> None:
        for buffer in self.buffers:
            buffer.clear()
