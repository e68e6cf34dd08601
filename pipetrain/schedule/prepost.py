"""Receive pre-posting: how many of a step's receives each rank posts at the step's start, per channel.

    prepost = prepost_schedule(schedule, plan, receive_bytes, budgets)   # per rank, per step program
    prepost[rank][step].depth((peer, "F")), prepost[rank][step].nbytes

A rank posts the first receives of every channel (``(peer, "F")`` for activations, ``(peer, "B")`` for
gradients) before it runs a step, and each receive it takes posts the next of its channel, so a
channel keeps its depth posted ahead of its RECV actions. The depth, per rank and step program:

* bounded queues (local learning, ``MethodParams.queue_bound`` ``N``): ``N``, the queue a sender
  waits on;
* otherwise the most receives ``d >= PREPOSTED`` per channel whose buffers (the first ``d`` receives
  of every channel, together) fit the backend's budget (:func:`prepost_budget`), and no more than
  the longest channel has; on small and mid-sized models that is every receive of the step.

Every channel is posted ``min(d, its receives)`` deep; :attr:`Prepost.nbytes` is those buffers' bytes
(memory the plan's activation model does not count; the simulator reports it per rank,
``Timeline.prepost_bytes``). The runtime's transport executes exactly this
(:meth:`~pipetrain.runtime.interp.transport.Transport.expect`); a step program is the rank's program,
or for an asynchronous plan its chunk of one batch (:func:`step_programs`).

Why (gloo): a message that arrives before its receive is posted takes a slower path (about 2 ms more
on a 2-core machine, whatever its size, against about 50 µs), and a receive posted while its peer is
sending on the same connection can stall both ranks for milliseconds: gloo holds a connection's lock
while it writes, its event loop spins on that lock (``try_lock`` under level-triggered epoll) and a
2-core scheduler runs the spinning peer's loop thread on the lock holder's core. Posting a step's
receives at its start keeps them out of the middle of its bursts of sends: measured (4 alternating
pairs, 2 ranks, this machine) gpt-tiny interleaved m=8 −15.5 %, zbv m=8 −4 %, the mlp's
interleaved-zb with 4 chunks −2.3 %, plans with few messages unchanged (benchmarks/history/prepost.md).

The pass is pure: receive sizes come from the caller (the runtime: the tensors its stages exchange;
the simulator: the cost model's message bytes). Cost: O(channels · receives of the longest channel)
per rank and step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.versions import batch_chunks

__all__ = ["PREPOSTED", "PREPOST_BYTES", "Channel", "Prepost", "device_backend", "prepost_budget", "prepost_program",
           "prepost_schedule", "step_programs"]

PREPOSTED = 2
"""Receives kept posted ahead per channel at least (bounded queues: their depth instead)."""

PREPOST_BYTES = 64 * 2**20
"""On gloo, the receive buffers a rank may post at a step's start beyond :data:`PREPOSTED` per channel."""

Channel = tuple[int, Literal["F", "B"]]
"""Where a rank's receives arrive from: ``(peer rank, "F" or "B")`` (:attr:`Action.channel`)."""

_RECEIVES = (ActionKind.RECV_F, ActionKind.RECV_B)


def prepost_budget(backend: str) -> int:
    """The receive buffers a rank on ``backend`` may post at a step's start beyond :data:`PREPOSTED`
    per channel: :data:`PREPOST_BYTES` on gloo (module docstring), 0 on NCCL (GPU memory)."""
    return PREPOST_BYTES if backend == "gloo" else 0


def device_backend(kind: str) -> str:
    """The backend a rank on a device of ``kind`` talks over: gloo on a CPU, NCCL on an accelerator."""
    return "gloo" if kind.partition("#")[0].lower() == "cpu" else "nccl"


@dataclass(frozen=True)
class Prepost:
    """One rank's pre-posting for one step program.

    Attributes:
        depths: per channel, in the order of the program's first receive on it, the receives posted
            at the step's start.
        nbytes: the bytes of those receives' buffers together.
    """

    depths: tuple[tuple[Channel, int], ...] = ()
    nbytes: int = 0

    def depth(self, channel: Channel) -> int:
        """Receives of ``channel`` posted at the step's start (0 for a channel the step does not use)."""
        return dict(self.depths).get(channel, 0)


def prepost_program(program: Sequence[Action], receive_bytes: Callable[[Action], int], budget_bytes: int,
                    bound: int | None = None) -> Prepost:
    """The pre-posting of one step ``program`` of a rank (module docstring).

    Args:
        receive_bytes: the bytes of a RECV action's message.
        budget_bytes: the backend's budget beyond :data:`PREPOSTED` per channel (:func:`prepost_budget`).
        bound: the bounded queues' depth, or None.
    """
    channels: dict[Channel, list[int]] = {}
    for a in program:
        if a.kind in _RECEIVES and a.peer is not None:
            channels.setdefault((a.peer, a.channel), []).append(receive_bytes(a))
    depth = bound if bound is not None else _depth_within(list(channels.values()), budget_bytes)
    depths = tuple((channel, min(depth, len(sizes))) for channel, sizes in channels.items())
    return Prepost(depths, _first_bytes(list(channels.values()), depth))


def _depth_within(channels: list[list[int]], budget_bytes: int) -> int:
    """The most receives per channel, at least :data:`PREPOSTED`, whose buffers (the first that many of
    every channel) fit ``budget_bytes`` together, and no more than the longest channel has."""
    longest = max((len(sizes) for sizes in channels), default=0)
    depth, total = PREPOSTED, _first_bytes(channels, PREPOSTED)
    while depth < longest:
        total += sum(sizes[depth] for sizes in channels if len(sizes) > depth)
        if total > budget_bytes:
            break
        depth += 1
    return depth


def _first_bytes(channels: list[list[int]], n: int) -> int:
    """Bytes of the first ``n`` receives of every channel."""
    return sum(sum(sizes[:n]) for sizes in channels)


def step_programs(program: Sequence[Action], plan: Plan, batches: int) -> list[tuple[Action, ...]]:
    """What a rank runs per step: its program, or an asynchronous plan's per-batch chunks of it
    (:func:`~pipetrain.schedule.versions.batch_chunks`, ``batches`` of them)."""
    return batch_chunks(program, plan.batch_size, batches) if plan.asynchronous else [tuple(program)]


def prepost_schedule(schedule: Schedule, plan: Plan, receive_bytes: Callable[[int, Action], int],
                     budget_bytes: Sequence[int], batches: int | None = None) -> tuple[tuple[Prepost, ...], ...]:
    """Every rank's pre-posting of each of its step programs (:func:`step_programs`).

    Args:
        receive_bytes: the bytes of rank ``r``'s RECV action's message.
        budget_bytes: per rank, the budget of its backend (:func:`prepost_budget`).
        batches: the batches an asynchronous schedule spans (default: as many as its ranges reach).
    """
    if batches is None:
        end = max((a.hi for _, program in schedule for a in program), default=0)
        batches = max(1, -(-end // plan.batch_size))
    bound = plan.params.queue_bound
    return tuple(
        tuple(prepost_program(step, partial(receive_bytes, rank), budget_bytes[rank], bound)
              for step in step_programs(program, plan, batches))
        for rank, program in schedule
    )
