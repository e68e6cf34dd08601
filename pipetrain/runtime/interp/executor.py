"""The interpreter: a rank runs its program, one handler per action kind (STYLE.md L2).

There are no per-method loops: every method runs through :func:`run_program`, which is, in spirit,
``for action in program: HANDLERS[action.kind](ctx, action)``. A handler knows no method either: what
F, B, W and STEP do on a stage is its stage kernel's (:class:`~pipetrain.runtime.interp.context.StageKernel`,
chosen once from the method's traits when the stage is built), and what a message moves is the
kernel's ports' (``[lo, hi)`` is the action's sample range)::

    RECV_F  receive [hi-lo, *spec] from peer (pre-posted at the step's start as the schedule pass
            :mod:`pipetrain.schedule.prepost` decided, :func:`receive_prepost`; floating point in the
            compute dtype under bf16 and fp16); the kernel's ports store it by range
    F       kernel.forward    (a chain's: :mod:`~pipetrain.runtime.interp.chain`; a DAG's: :mod:`~.dag`;
                               local learning's: :mod:`~.local`; an evaluation's: :mod:`~.evaluation`),
                              under autocast at the plan's precision (:mod:`~.precision`)
    SEND_F  post a send of the ports' tensor of [lo, hi) to peer, cast to the message's dtype
    RECV_B  as RECV_F, on the backward channel
    B       kernel.backward
    SEND_B  as SEND_F, on the backward channel
    W       kernel.weight     (split backward's weight gradients)
    STEP    kernel.step       (the optimizer step; a flush's checks)

Activations travel on the forward channel and gradients on the backward one (their own tags,
:class:`~pipetrain.runtime.interp.transport.Direction`). A rank that runs several stages (methods
``interleaved``, ``zbv``) has one context per stage and runs each action on its stage's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.transport import Direction, Message, message_bytes
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.prepost import Prepost, prepost_program
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.validate import validate_for_plan
from pipetrain.schedule.versions import validate_versions

__all__ = [
    "HANDLERS",
    "ActionHook",
    "Contexts",
    "Handler",
    "check_runnable",
    "context_of",
    "expected_receives",
    "message",
    "receive_prepost",
    "run_program",
]


class ActionHook(Protocol):
    """Called around every action (timing, fault injection); must not change the computation."""

    def before(self, index: int, action: Action) -> None: ...

    def after(self, index: int, action: Action) -> None: ...


def message(ctx: RankContext, a: Action) -> Message:
    """What communication action ``a`` moves: ``(shape, dtype, peer, direction)`` of its tensor, from
    the per-sample spec of the kernel's ports; a floating-point tensor travels in the stage's compute
    dtype (:meth:`~pipetrain.runtime.interp.precision.StagePrecision.wire_dtype`)."""
    assert a.peer is not None
    spec = ctx.kernel.ports.spec(a)
    return (a.size, *spec.shape), ctx.precision.wire_dtype(spec.torch_dtype), a.peer, Direction.of(a.channel)


def _forward(ctx: RankContext, a: Action) -> None:
    """F under the plan's precision (autocast under bf16 and fp16: :mod:`~pipetrain.runtime.interp.precision`)."""
    with ctx.precision.autocast():
        ctx.kernel.forward(ctx, a)


def _backward(ctx: RankContext, a: Action) -> None:
    ctx.kernel.backward(ctx, a)


def _weight(ctx: RankContext, a: Action) -> None:
    ctx.kernel.weight(ctx, a)


def _step(ctx: RankContext, a: Action) -> None:
    ctx.kernel.step(ctx, a)


def _send(ctx: RankContext, a: Action) -> None:
    """SEND_F sends the stage's output, SEND_B the gradient of its input, cast to the message's dtype."""
    _, dtype, peer, direction = message(ctx, a)
    ctx.transport.send(ctx.kernel.ports.buffer(a).take(a.lo, a.hi).to(dtype), peer, direction)


def _recv(ctx: RankContext, a: Action) -> None:
    """RECV_F receives the stage's input, RECV_B the gradient of its output."""
    ctx.kernel.ports.buffer(a).put(a.lo, a.hi, ctx.transport.recv(*message(ctx, a)))


Handler = Callable[[RankContext, Action], None]

HANDLERS: dict[ActionKind, Handler] = {
    ActionKind.F: _forward,
    ActionKind.B: _backward,
    ActionKind.W: _weight,
    ActionKind.SEND_F: _send,
    ActionKind.RECV_F: _recv,
    ActionKind.SEND_B: _send,
    ActionKind.RECV_B: _recv,
    ActionKind.STEP: _step,
}


Contexts = RankContext | Mapping[int, RankContext]
"""A rank's context, or its contexts by stage when it runs several (methods ``interleaved``, ``zbv``)."""


def context_of(ctx: Contexts, a: Action) -> RankContext:
    """The context that runs ``a``: the rank's own, or that of ``a``'s stage."""
    return ctx if isinstance(ctx, RankContext) else ctx[a.stage]


def expected_receives(ctx: Contexts, program: Sequence[Action]) -> list[Message]:
    """The receives of ``program``, in order, as the transport pre-posts them."""
    return [message(context_of(ctx, a), a) for a in program
            if a.peer is not None and a.kind in (ActionKind.RECV_F, ActionKind.RECV_B)]


def receive_prepost(ctx: Contexts, program: Sequence[Action], budget_bytes: int, bound: int | None) -> Prepost:
    """How deep the transport posts each channel of ``program``'s receives at its start: the schedule
    pass (:func:`~pipetrain.schedule.prepost.prepost_program`) on the tensors the stages exchange."""
    return prepost_program(program, lambda a: message_bytes(message(context_of(ctx, a), a)), budget_bytes, bound)


def run_program(ctx: Contexts, program: Sequence[Action], hooks: Sequence[ActionHook] = ()) -> None:
    """Execute one step's program: each action through its handler (on its stage's context), hooks
    around it."""
    for index, action in enumerate(program):
        for hook in hooks:
            hook.before(index, action)
        HANDLERS[action.kind](context_of(ctx, action), action)
        for hook in hooks:
            hook.after(index, action)


def check_runnable(schedule: Schedule, plan: Plan) -> None:
    """Reject, before launching, a schedule that does not run ``plan``
    (:func:`~pipetrain.schedule.validate.validate_for_plan`) or that the kernels cannot run: W
    actions outside a synchronous chain plan.

    Raises:
        UserError: naming the rank and action, and what to change.
    """
    for rank, program in schedule:
        for a in program:
            if a.kind is ActionKind.W and not plan.spec.synchronous_chain:
                raise UserError(f"rank {rank}: {a}: split backward (W) runs only on a synchronous chain plan "
                                "(zb1, zbv, 1f1b, interleaved[-zb]); remove the W actions")
    validate_for_plan(schedule, plan)
    if plan.asynchronous:
        validate_versions(schedule, plan)
