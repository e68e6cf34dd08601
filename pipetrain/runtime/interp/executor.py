"""The interpreter: a rank runs its program, one handler per action kind (STYLE.md L2).

There are no per-method loops: GPipe, 1F1B and unequal micro-batches all run through
:func:`run_program`, which is, in spirit, ``for action in program: HANDLERS[action.kind](ctx, a)``.

Handler semantics (``[lo, hi)`` is the action's sample range, ``B`` the mini-batch size)::

    RECV_F  receive input activations [hi-lo, *in]  from peer; store by range
    F       x = stored inputs [lo, hi) (re-chunked); y = layers(x); last stage:
            y = loss(y, targets[lo:hi]) / B; keep (x, y); store y for SEND_F
            (recomputing stage: run under no_grad and keep only x, by range;
            evaluating: under no_grad, keep nothing; the last stage adds (y, targets) to the tally)
    SEND_F  post a send of the stored outputs [lo, hi) to peer
    RECV_B  receive output gradients [hi-lo, *out] from peer; store by range
    B       backward(y, grad of y) for the F of exactly [lo, hi); store x.grad for SEND_B
            (split backward, a program with W actions: the gradients of x and of each layer's
            output in one pass that keeps the graph; they are kept for W)
            (recomputing stage: x = kept inputs [lo, hi), re-chunked; y = layers(x) with
            autograd; then the same backward, so [lo, hi) need not match any F range)
    SEND_B  post a send of the stored input gradients [lo, hi) to peer
    STEP    wait for posted sends (asynchronous methods: the job waits at the next step, once every
            rank has posted that step's receives); on a replicated stage, all-reduce (sum) the gradients and the
            loss over the stage's ranks; clip the global gradient norm (if set); optimizer step;
            zero gradients
    W       weight gradients of the B of exactly [lo, hi): per parameter owner, from the gradient of
            its output, accumulated into .grad; then the micro-batch's activations are released

Local learning (method ``local``): on a rank whose context has ``local`` state, F, B and STEP are
:mod:`pipetrain.runtime.interp.local_handlers`' (a local loss through an auxiliary head, a local backward
and a per-micro-batch step); evaluation and the communication handlers are the ones above.

Gradient weighting (STYLE.md L14): the loss of every micro-batch is the *sum* of its samples' losses
divided by the full batch size ``B``, so the accumulated gradients equal single-process training on
the whole batch for any micro-batching, equal or not. Nothing else scales gradients: the replicas
of a replicated stage each hold the sum over their own micro-batches, so summing them over the
stage's group at STEP gives the whole batch's gradient (no averaging, no learning-rate scaling).

Asynchronous methods (``pipedream``, ``2bw``): F and B run on the version their action names and B
hands its weight gradients to the module; STEP commits a new version (:mod:`pipetrain.runtime.interp.versions`).
The program spans the run and runs one batch's chunk per step (:func:`~pipetrain.schedule.versions.
batch_chunks`), so in-flight micro-batches stay kept across steps and ranges index the run
(``sample_offset``); under ``pipedream`` each micro-batch is a mini-batch and its loss is divided by
its own size.

Split backward (``zb1``, ``interleaved-zb``, ``zbv``; Qi et al. 2024 "Zero Bubble Pipeline Parallelism" §2): a
rank whose program has W actions runs each backward in two parts (:mod:`pipetrain.graph.split_backward`).
Forward records the output of every module holding parameters of its own; B back-propagates
``grad [hi-lo, *out]`` (the last stage: the scalar loss) to the stage input ``x [hi-lo, *in]`` and
to every recorded output, keeping the graph; W later computes each such module's weight gradients
from its output's gradient and frees the graph. The weight gradients are the fused backward's, so training
is unchanged.

Recompute (docs/algorithms.md §2.6) is per stage, as :meth:`pipetrain.plan.plan.Plan.recomputes` says: a
stage whose backward partition differs from its forward one cannot back-propagate part of a forward
micro-batch's graph, so it re-runs forward per backward micro-batch. The re-run must compute what
the first run did, so such a stage may not hold modules that draw random numbers (dropout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.data import EvalTally, Loss
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import TensorSpec
from pipetrain.graph.split_backward import StageParts, WeightWork, input_grads, layer_outputs, weight_grads
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.runtime.interp.dag_handlers import (
    DagStage,
    dag_backward,
    dag_forward,
    dag_message_spec,
    dag_recv,
    dag_send,
)
from pipetrain.runtime.interp.local_handlers import LocalStage, local_backward, local_forward, local_step
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.transport import Direction, Message, Transport
from pipetrain.runtime.interp.versions import WeightVersions
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate_for_plan
from pipetrain.schedule.versions import validate_versions

__all__ = [
    "HANDLERS",
    "ActionHook",
    "Contexts",
    "Handler",
    "OptimizerFactory",
    "RankContext",
    "check_runnable",
    "context_of",
    "expected_receives",
    "run_program",
]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
Range = tuple[int, int]


@dataclass
class RankContext:
    """Everything one rank's handlers read and write during a step.

    Attributes:
        rank: this process's global rank.
        stage: the stage it runs; ``n_stages`` the stage count.
        module: the stage's layers, in order, on ``transport.device``.
        optimizer: over ``module``'s parameters; None for a stage without parameters.
        loss: the loss (used on the last stage): a micro-batch's sum over samples.
        batch_size: samples per mini-batch (the loss divisor).
        input_spec / output_spec: per-sample specs of the tensors entering and leaving the stage.
        transport: sends and receives.
        meter: saved-activation bytes.
        inputs: input activations by range (stage 0: the whole batch as one chunk).
        targets: the batch's targets ``[B, ...]`` (last stage only).
        outputs: output activations waiting for SEND_F.
        output_grads: received gradients of the outputs, waiting for B.
        input_grads: gradients of the inputs, waiting for SEND_B.
        saved: per forward range, ``(x, y)`` kept for backward.
        recompute: keep only the inputs in forward (in ``stashed``) and re-run forward in backward.
        stashed: input activations kept by range for the re-run (recomputing stages).
        loss_total: the step's loss so far (last stage), a 0-d tensor.
        replicas: the process group of the stage's ranks when it is replicated, else None.
        input_ranges: stage 0's sample ranges on this rank (its micro-batches); None: the whole batch.
        evaluation: while evaluating, the tally the last stage adds its outputs to (a forward-only
            program runs; nothing is kept for backward); None while training.
        clip: clips the gradients before the optimizer step (global norm over all stages), or None.
        local: local learning's state (the auxiliary head, the queue depth), or None for methods
            that back-propagate end to end.
        versions: the stage's weight versions (asynchronous methods), else None.
        sample_offset: the first sample of the loaded batch in the ranges the actions name.
        microbatch_loss: divide each micro-batch's loss by its own size, not ``batch_size`` (pipedream).
        loss_count: the micro-batches in ``loss_total``.
        dag: method ``graph``: the stage's ports toward each neighbouring stage (a DAG of stages);
            None for a chain.
        split_backward: the program splits backward into B and W (it has W actions).
        layer_parts: per forward range, what its forward recorded for the split backward.
        weight_pending: per range, the work a B left for its W (split backward).
    """

    rank: int
    stage: int
    n_stages: int
    module: nn.Module
    optimizer: torch.optim.Optimizer | None
    loss: Loss
    batch_size: int
    input_spec: TensorSpec
    output_spec: TensorSpec
    transport: Transport
    meter: ActivationMeter
    inputs: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("input activations"))
    targets: torch.Tensor | None = None
    outputs: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("output activations"))
    output_grads: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("output gradients"))
    input_grads: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("input gradients"))
    saved: dict[Range, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    recompute: bool = False
    stashed: ChunkBuffer = field(default_factory=lambda: ChunkBuffer("stashed inputs"))
    loss_total: torch.Tensor | None = None
    replicas: dist.ProcessGroup | None = None
    input_ranges: tuple[Range, ...] | None = None
    evaluation: EvalTally | None = None
    clip: Callable[[list[nn.Parameter]], object] | None = None
    local: LocalStage | None = None
    versions: WeightVersions | None = None
    sample_offset: int = 0
    microbatch_loss: bool = False
    loss_count: int = 0
    dag: DagStage | None = None
    split_backward: bool = False
    layer_parts: dict[Range, StageParts] = field(default_factory=dict)
    weight_pending: dict[Range, WeightWork] = field(default_factory=dict)

    @property
    def is_first(self) -> bool:
        """Whether the stage reads the model input (stage 0 of a chain; a DAG's stages with source layers)."""
        return self.dag.reads_input if self.dag is not None else self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    def begin_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                   input_ranges: Sequence[Range] | None = None, offset: int = 0) -> None:
        """Load a mini-batch: ``inputs [B, ...]`` on stage 0, ``targets [B, ...]`` on the last.

        ``input_ranges``: stage 0's ranges to load (default :attr:`input_ranges`, else the whole batch);
        ``offset``: where the batch starts in the actions' ranges. An asynchronous stage keeps its
        in-flight micro-batches. Local learning takes the targets on every stage, and the inputs where
        a head reconstructs them.
        """
        for buffer in self.buffers:
            if self.versions is None or buffer is not self.stashed:
                buffer.clear()
        if self.versions is None:
            self.saved.clear()
            self.weight_pending.clear()
            self.layer_parts.clear()
            if self.dag is not None:
                self.dag.saved.clear()
        self.loss_total, self.loss_count, self.sample_offset = None, 0, offset
        device = self.transport.device
        if self.is_first:
            if inputs is None:
                raise ValueError("stage 0 needs the batch's inputs")
            chosen = input_ranges if input_ranges is not None else self.input_ranges
            for lo, hi in chosen if chosen is not None else ((0, inputs.shape[0]),):
                self.inputs.put(lo + offset, hi + offset, inputs[lo:hi].to(device))
        local = self.local
        if local is not None:
            local.images = inputs.to(device) if local.needs_images and inputs is not None else None
        wanted = self.is_last or local is not None
        self.targets = targets.to(device) if wanted and targets is not None else None

    @property
    def buffers(self) -> tuple[ChunkBuffer, ...]:
        own = (self.inputs, self.outputs, self.output_grads, self.input_grads, self.stashed)
        return own + (self.dag.buffers if self.dag is not None else ())

    def step_loss(self) -> float | None:
        """The mini-batch loss (mean over samples) on the last stage after its step; else None.
        Under ``pipedream`` the mean of the step's micro-batch (mini-batch) losses."""
        if self.loss_total is None:
            return None
        return float(self.loss_total) / (self.loss_count if self.microbatch_loss else 1)


class ActionHook(Protocol):
    """Called around every action (timing, fault injection); must not change the computation."""

    def before(self, index: int, action: Action) -> None: ...

    def after(self, index: int, action: Action) -> None: ...


# ---- handlers -------------------------------------------------------------------------------


def _run_layers(ctx: RankContext, x: torch.Tensor, a: Action) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: the stage on the action's samples (on its weight version, if it names one); on the
    last stage ``y`` is the weighted loss."""
    if not ctx.is_first and x.is_floating_point() and torch.is_grad_enabled():
        x = x.detach().requires_grad_(True)
    if ctx.split_backward and torch.is_grad_enabled():
        y, ctx.layer_parts[(a.lo, a.hi)] = layer_outputs(ctx.module, x, keep_hooks=True)
    else:
        y = ctx.module(x) if ctx.versions is None or a.version is None else ctx.versions.call(a.version, x)
    if ctx.is_last:
        if ctx.targets is None:
            raise ValueError("the last stage has no targets; call begin_step first")
        lo, hi = a.lo - ctx.sample_offset, a.hi - ctx.sample_offset
        y = ctx.loss(y, ctx.targets[lo:hi]) / (a.size if ctx.microbatch_loss else ctx.batch_size)
    return x, y


def _forward(ctx: RankContext, a: Action) -> None:
    if ctx.dag is not None:
        dag_forward(ctx, ctx.dag, a)
        return
    if ctx.evaluation is not None:
        _evaluate(ctx, ctx.evaluation, ctx.inputs.take(a.lo, a.hi), a)
        return
    if ctx.local is not None:
        local_forward(ctx, a)
        return
    x = ctx.inputs.take(a.lo, a.hi)
    if ctx.recompute:
        with torch.no_grad():
            _, y = _run_layers(ctx, x, a)
        ctx.stashed.put(a.lo, a.hi, x)
        ctx.meter.add(x.nbytes)
    else:
        with ctx.meter.track((a.lo, a.hi)):
            x, y = _run_layers(ctx, x, a)
        ctx.saved[(a.lo, a.hi)] = (x, y)
    if ctx.versions is not None and a.version is not None:
        ctx.versions.used(a.version)
    if ctx.is_last:
        loss = y.detach()
        ctx.loss_total = loss if ctx.loss_total is None else ctx.loss_total + loss
        ctx.loss_count += 1
    else:
        ctx.outputs.put(a.lo, a.hi, y.detach())


def _evaluate(ctx: RankContext, tally: EvalTally, x: torch.Tensor, a: Action) -> None:
    """Forward without autograd; the last stage tallies, the others store the output for SEND_F."""
    with torch.no_grad():
        y = ctx.module(x)
    if not ctx.is_last:
        ctx.outputs.put(a.lo, a.hi, y)
        return
    if ctx.targets is None:
        raise ValueError("the last stage has no targets; call begin_step first")
    tally.add(ctx.loss, y, ctx.targets[a.lo:a.hi])


def _recomputed(ctx: RankContext, a: Action) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` for ``[lo, hi)`` re-run from the stashed inputs, with autograd."""
    x = ctx.stashed.take(a.lo, a.hi)
    with ctx.meter.track((a.lo, a.hi)):
        x, y = _run_layers(ctx, x, a)
    ctx.meter.add(-x.nbytes)
    return x, y


def _backward(ctx: RankContext, a: Action) -> None:
    if ctx.dag is not None:
        dag_backward(ctx, ctx.dag, a)
        return
    if ctx.local is not None:
        local_backward(ctx, a)
        return
    key = (a.lo, a.hi)
    if ctx.recompute:
        x, y = _recomputed(ctx, a)
    elif key in ctx.saved:
        x, y = ctx.saved.pop(key)
    else:
        raise UserError(
            f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {sorted(ctx.saved)}); a stage "
            "whose backward ranges differ from its forward ranges must recompute"
        )
    grad = None if ctx.is_last else ctx.output_grads.take(a.lo, a.hi)
    if ctx.split_backward:
        _input_grad(ctx, a, x, y, grad)
        return
    torch.autograd.backward(y, grad)
    if ctx.versions is not None and a.version is not None:
        ctx.versions.collect(a.version)
        ctx.versions.used(a.version)
    ctx.meter.release(key)
    if x.requires_grad:
        x_grad = x.grad if x.grad is not None else torch.zeros_like(x)
        ctx.input_grads.put(a.lo, a.hi, x_grad)


def _input_grad(ctx: RankContext, a: Action, x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor | None) -> None:
    """B of a split backward: the gradients of the stage input and of every layer output; what W needs kept."""
    x_grad, ctx.weight_pending[(a.lo, a.hi)] = input_grads(y, grad, x, ctx.layer_parts.pop((a.lo, a.hi)))
    ctx.meter.hold((a.lo, a.hi), [g for _, g in ctx.weight_pending[(a.lo, a.hi)]])  # released at W
    if x_grad is not None:
        ctx.input_grads.put(a.lo, a.hi, x_grad)


def _weight_grad(ctx: RankContext, a: Action) -> None:
    """W of a split backward: the parameters' gradients of the B of ``[lo, hi)``, then release its graph."""
    key = (a.lo, a.hi)
    if key not in ctx.weight_pending:
        raise UserError(f"{a}: no B of exactly [{a.lo}:{a.hi}) waits for its W (pending: "
                        f"{sorted(ctx.weight_pending)}); put each W after the B of its range")
    weight_grads(ctx.weight_pending.pop(key))
    ctx.meter.release(key)


def _message(ctx: RankContext, a: Action) -> Message:
    """What a communication action moves: ``(shape, dtype, peer, direction)`` of its tensor, an
    activation (the stage's input or output spec) on the forward channel, a gradient on the backward."""
    assert a.peer is not None
    forward = a.kind in (ActionKind.SEND_F, ActionKind.RECV_F)
    receiving = a.kind in (ActionKind.RECV_F, ActionKind.RECV_B)
    spec = ctx.input_spec if forward == receiving else ctx.output_spec
    if ctx.dag is not None:
        spec = dag_message_spec(ctx.dag, a)
    return (a.size, *spec.shape), spec.torch_dtype, a.peer, Direction.ACTIVATION if forward else Direction.GRADIENT


def _send(ctx: RankContext, a: Action) -> None:
    """SEND_F sends the stage's output, SEND_B the gradient of its input."""
    _, _, peer, direction = _message(ctx, a)
    if ctx.dag is not None:
        ctx.transport.send(dag_send(ctx, ctx.dag, a), peer, direction)
        return
    source = ctx.outputs if a.kind is ActionKind.SEND_F else ctx.input_grads
    ctx.transport.send(source.take(a.lo, a.hi), peer, direction)


def _recv(ctx: RankContext, a: Action) -> None:
    """RECV_F receives the stage's input, RECV_B the gradient of its output."""
    tensor = ctx.transport.recv(*_message(ctx, a))
    if ctx.dag is not None:
        dag_recv(ctx.dag, a, tensor)
        return
    target = ctx.inputs if a.kind is ActionKind.RECV_F else ctx.output_grads
    target.put(a.lo, a.hi, tensor)


def _step(ctx: RankContext, a: Action) -> None:
    if ctx.local is not None:
        local_step(ctx, a)
        return
    if ctx.versions is None:  # asynchronous: a gradient sent now is received in the peer's next chunk
        ctx.transport.wait_sends()
    if ctx.replicas is not None:
        _allreduce_gradients(ctx)
    if ctx.clip is not None:
        ctx.clip([p for p in ctx.module.parameters() if p.requires_grad])
    ctx.meter.note_gradients()
    if ctx.optimizer is not None:
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
    if ctx.versions is not None:  # asynchronous: micro-batches stay in flight across STEPs
        ctx.versions.commit()
        return
    leftovers = [b for b in ctx.buffers if len(b)]
    if leftovers or ctx.saved or ctx.weight_pending or (ctx.dag is not None and ctx.dag.saved):
        names = [f"{b.name} {b.ranges()}" for b in leftovers] + [f"forwards {sorted(ctx.saved)}",
                                                                 f"weight gradients {sorted(ctx.weight_pending)}"]
        raise RuntimeError(f"{a}: the step left unconsumed data: {', '.join(names)}")


def _allreduce_gradients(ctx: RankContext) -> None:
    """Sum the stage's gradients (and, on the last stage, the loss) over its replicas, in one message."""
    params = [p for p in ctx.module.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    if ctx.is_last:
        loss = ctx.loss_total if ctx.loss_total is not None else torch.zeros((), device=ctx.transport.device)
        grads.append(loss.reshape(1))
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=ctx.replicas)
    offset = 0
    for p, g in zip(params, grads, strict=False):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()
    if ctx.is_last:
        ctx.loss_total = flat[-1].clone()


Handler = Callable[[RankContext, Action], None]

HANDLERS: dict[ActionKind, Handler] = {
    ActionKind.F: _forward,
    ActionKind.B: _backward,
    ActionKind.W: _weight_grad,
    ActionKind.SEND_F: _send,
    ActionKind.RECV_F: _recv,
    ActionKind.SEND_B: _send,
    ActionKind.RECV_B: _recv,
    ActionKind.STEP: _step,
}


Contexts = RankContext | Mapping[int, RankContext]
"""A rank's context, or its contexts by stage when it runs several (method ``interleaved``)."""


def context_of(ctx: Contexts, a: Action) -> RankContext:
    """The context that runs ``a``: the rank's own, or that of ``a``'s stage."""
    return ctx if isinstance(ctx, RankContext) else ctx[a.stage]


def expected_receives(ctx: Contexts, program: Sequence[Action]) -> list[Message]:
    """The receives of ``program``, in order, as the transport pre-posts them."""
    return [_message(context_of(ctx, a), a) for a in program
            if a.peer is not None and a.kind in (ActionKind.RECV_F, ActionKind.RECV_B)]


def run_program(ctx: Contexts, program: Sequence[Action], hooks: Sequence[ActionHook] = ()) -> None:
    """Execute one step's program: each action through its handler (on its stage's context), hooks
    around it. A program with W actions splits every backward into B and W (module docstring)."""
    split = any(a.kind is ActionKind.W for a in program)
    for c in [ctx] if isinstance(ctx, RankContext) else ctx.values():
        c.split_backward = split
    for index, action in enumerate(program):
        for hook in hooks:
            hook.before(index, action)
        HANDLERS[action.kind](context_of(ctx, action), action)
        for hook in hooks:
            hook.after(index, action)


# ---- setup ----------------------------------------------------------------------------------


def check_runnable(schedule: Schedule, plan: Plan) -> None:
    """Reject, before launching, a schedule that does not run ``plan``
    (:func:`~pipetrain.schedule.validate.validate_for_plan`) or that the handlers cannot run: W
    actions outside a synchronous chain plan that keeps its activations.

    Raises:
        UserError: naming the rank and action, and what to change.
    """
    splits = not (plan.asynchronous or plan.method in (Method.GRAPH, Method.LOCAL)
                  or any(plan.recomputes(k) for k in range(plan.n_stages)))
    for rank, program in schedule:
        for a in program:
            if a.kind is ActionKind.W and not splits:
                raise UserError(f"rank {rank}: {a}: split backward (W) runs only on a synchronous chain plan that "
                                "keeps its activations (zb1, zbv, 1f1b, interleaved[-zb]); remove the W actions")
    validate_for_plan(schedule, plan)
    if plan.asynchronous:
        validate_versions(schedule, plan)
