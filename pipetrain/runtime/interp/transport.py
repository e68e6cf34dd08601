"""Point-to-point messages between stages over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

No shape headers travel: a receiver knows every message's shape from the plan (the sample range
times the per-sample spec of the tensor crossing the stage boundary, from
``LayerGraph.output_specs()``), and its dtype from the spec and the plan's precision (floating-point
messages in the compute dtype under bf16 and fp16, :mod:`~pipetrain.runtime.interp.precision`; the
sender casts, the receiver allocates its buffer so). Sends are posted with ``isend`` and their handles kept until
:meth:`Transport.wait_sends` (called by the job once a step's program is done, so the optimizer step
overlaps the last messages' transfer), so a sender never waits for its receiver inside a step; the
sent tensors are kept alive and untouched until then.

Receives are *pre-posted*: at the start of a step the job announces the step's receives and how
deep each channel is posted, as the schedule pass :mod:`pipetrain.schedule.prepost` decided
(:meth:`Transport.expect`); the transport posts that many receives of every channel, and each
receive taken posts the next of its channel, so the channel stays that deep ahead of its RECV
actions (why: the pass's docstring).

Local learning bounds its queues (the plan's ``queue_depth`` N, :meth:`Transport.bound_sends`): a
sender keeps at most N sends outstanding per peer, waiting for the oldest before posting another, so
a fast stage is held back (its receiver keeps N receives posted per channel: the pass's depth).

Activations and gradients use distinct tags (backends without tags, such as NCCL, ignore them;
on a chain each directed link carries one direction only, so nothing is ambiguous).

On gloo every directed link ``src -> dst`` a job's schedule sends on gets a process group of its
own (:meth:`Transport.open_links`), so the two directions between two ranks travel on two TCP
connections instead of one, and a send need not share a connection with a large message arriving
the other way. Measured on the mlp's interleaved-zb plan with 4 chunks per rank (28 messages of 256
KiB per iteration in both directions), where some sends took milliseconds: 364.5 → 359.6 ms per step
(median of 8 alternating runs; plans with fewer messages unchanged; benchmarks/history/core.md).

On CUDA (not yet run on a GPU: docs/gpus.md):

* NCCL has no tags, and ``ProcessGroupNCCL`` runs every send and receive between two ranks of one
  group on one internal CUDA stream, in the order posted; NCCL executes them in that order. A
  receive pre-posted at a step's start would then hold back a later send to the same peer (rank 0
  posts "receive gradient 0" before "send activation 0", which its peer needs before it can send
  that gradient: a deadlock), and a link that carries both directions (a looping placement) would
  match an activation's send with a gradient's receive. So on NCCL every directed link gets a
  process group per direction (:meth:`Transport.open_links`): each channel is its own
  communicator, on its own stream, matched in order at both ends, as gloo matches by tag; each is
  started when opened, in the same order on every rank (:meth:`Transport._connect`). These
  internal streams are the sends' own streams: at an ``isend`` the group's stream waits for the
  compute stream's work so far (the tensor is ready) and the compute stream goes on; the allocator
  is told the tensor is in use on that stream, and the transport keeps it until
  :meth:`Transport.wait_sends`, whose ``wait`` makes the compute stream wait for the send, so its
  memory is not reused before the message has left. A stream of our own would add one more wait
  and no overlap. A receive's ``wait`` makes the compute stream (not the host) wait for it.
* gloo on CUDA tensors (``host_staged``; two ranks may share a GPU): gloo's ``send``/``recv`` take
  CPU tensors only, so a message is copied to host memory before its send and received into host
  memory, then copied to the rank's GPU.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Literal

import torch
import torch.distributed as dist

from pipetrain.schedule.prepost import Prepost

__all__ = ["Direction", "Message", "Transport", "TransportError", "message_bytes"]


class Direction(IntEnum):
    """What a message carries; the value is its tag."""

    ACTIVATION = 0  # forward: a stage's output activations to its successor
    GRADIENT = 1  # backward: a stage's input gradients to its predecessor

    @property
    def channel(self) -> Literal["F", "B"]:
        """The schedule's name of the direction (:attr:`~pipetrain.schedule.action.Action.channel`)."""
        return "F" if self is Direction.ACTIVATION else "B"

    @classmethod
    def of(cls, channel: Literal["F", "B"]) -> Direction:
        """The direction of a schedule's channel (the inverse of :attr:`channel`)."""
        return cls.ACTIVATION if channel == "F" else cls.GRADIENT


Message = tuple[tuple[int, ...], torch.dtype, int, "Direction"]  # shape, dtype, peer, direction
_Channel = tuple[int, "Direction"]


def message_bytes(message: Message) -> int:
    """The bytes of a message's tensor."""
    shape, dtype, _, _ = message
    return math.prod(shape) * dtype.itemsize


class TransportError(RuntimeError):
    """A send or receive failed, usually because the peer died or stopped answering.

    Attributes:
        peer: the other rank.
    """

    def __init__(self, message: str, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


class Transport:
    """One rank's sends and receives.

    Args:
        device: where received tensors end up (``cpu``, or the rank's ``cuda:i``).
        use_tags: pass :class:`Direction` tags (gloo); off for NCCL, which has none: each direction of a
            link then has a process group of its own (see the module docstring).
        host_staged: messages travel through host memory (gloo with ``device`` a GPU).
    """

    def __init__(self, device: torch.device, *, use_tags: bool = True, host_staged: bool = False) -> None:
        self.device = device
        self.use_tags = use_tags
        self.host_staged = host_staged
        self._wire = torch.device("cpu") if host_staged else device  # where buffers meet the backend
        self.window: int | None = None
        self._pending: list[tuple[dist.Work, torch.Tensor, int]] = []
        self._future: dict[_Channel, deque[Message]] = defaultdict(deque)
        self._posted: dict[_Channel, deque[tuple[torch.Tensor, dist.Work | None]]] = defaultdict(deque)
        self._links: dict[tuple[int, int], dist.ProcessGroup] = {}
        self._channels: dict[tuple[int, int, Direction], dist.ProcessGroup] = {}
        self._rank = -1

    @property
    def links(self) -> dict[tuple[int, int], dist.ProcessGroup]:
        """The process group of each directed link :meth:`open_links` opened (empty: the default group)."""
        return dict(self._links)

    @property
    def channels(self) -> dict[tuple[int, int, Direction], dist.ProcessGroup]:
        """Without tags (NCCL): the process group of each ``(src, dst, direction)`` :meth:`open_links` opened."""
        return dict(self._channels)

    def open_links(self, links: Iterable[tuple[int, int]]) -> None:
        """Give each directed link ``(src, dst)`` its own two-rank process group (gloo), or one per
        direction of it (without tags: NCCL); see the module docstring. Links opened before are kept.
        Every rank of the launch must call this with the same links in the same order
        (``dist.new_group`` is collective).
        """
        self._rank = dist.get_rank()
        for src, dst in links:
            if self.use_tags:
                if (src, dst) not in self._links:
                    self._links[(src, dst)] = dist.new_group(sorted((src, dst)))
                continue
            for direction in Direction:
                if (src, dst, direction) not in self._channels:
                    self._channels[(src, dst, direction)] = group = dist.new_group(sorted((src, dst)))
                    self._connect(group, src, dst)

    def _connect(self, group: dist.ProcessGroup, src: int, dst: int) -> None:
        """Exchange one element on a new channel's group now, while every rank opens the channels in the
        same order. NCCL creates a pair's communicator at its first send or receive there, and creating
        it blocks the host until the peer's first one: left to the first step, rank 0 pre-posting its
        gradient receive and rank 1 its activation receive would each wait for the other forever.

        Raises:
            TransportError: the peer is gone.
        """
        if self._rank not in (src, dst):
            return
        probe = torch.zeros(1, device=self._wire)
        peer = dst if self._rank == src else src
        try:
            work = dist.isend(probe, dst, group=group) if self._rank == src else dist.irecv(probe, src, group=group)
            if work is not None:
                work.wait()
        except RuntimeError as e:
            raise TransportError(f"opening a channel with rank {peer} failed: {e}", peer) from e

    def _group(self, src: int, dst: int, direction: Direction) -> dist.ProcessGroup | None:
        """The process group a message from ``src`` to ``dst`` travels on (None: the default group)."""
        channel = self._channels.get((src, dst, direction))
        return channel if channel is not None else self._links.get((src, dst))

    def bound_sends(self, window: int | None) -> None:
        """Local learning's bounded queues: at most ``window`` sends outstanding per peer (see the
        module docstring); None: sends unbounded until STEP (the other methods)."""
        self.window = window

    def expect(self, messages: Sequence[Message], prepost: Prepost) -> None:
        """Announce this step's receives, in program order, and post the first ones of each channel,
        as deep as ``prepost`` says (:mod:`pipetrain.schedule.prepost`); each receive taken later posts
        the next of its channel.

        Raises:
            TransportError: a receive could not be posted (the peer is gone).
        """
        self._future.clear()
        self._posted.clear()
        for message in messages:
            self._future[(message[2], message[3])].append(message)
        for peer, direction in list(self._future):
            for _ in range(prepost.depth((peer, direction.channel))):
                self._post_next((peer, direction))

    def _post_next(self, channel: _Channel) -> None:
        future = self._future.get(channel)
        if not future:
            return
        shape, dtype, peer, direction = future.popleft()
        self._posted[channel].append(self._irecv(shape, dtype, peer, direction))

    def _irecv(
        self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, direction: Direction
    ) -> tuple[torch.Tensor, dist.Work | None]:
        buffer = torch.empty(shape, dtype=dtype, device=self._wire)
        tag = int(direction) if self.use_tags else 0
        try:
            return buffer, dist.irecv(buffer, peer, tag=tag, group=self._group(peer, self._rank, direction))
        except RuntimeError as e:
            raise TransportError(f"posting a receive from rank {peer} failed: {e}", peer) from e

    def send(self, tensor: torch.Tensor, peer: int, direction: Direction) -> None:
        """Post a send of ``tensor`` (made contiguous) to ``peer``; returns without waiting."""
        payload = tensor.detach().contiguous()
        if self.host_staged:
            payload = payload.to(self._wire)
        if self.window is not None:
            self._wait_window(peer, self.window)
        tag = int(direction) if self.use_tags else 0
        try:
            work = dist.isend(payload, peer, tag=tag, group=self._group(self._rank, peer, direction))
        except RuntimeError as e:
            raise TransportError(f"posting a send to rank {peer} failed: {e}", peer) from e
        if work is None:  # pragma: no cover - only when this rank is not in the group
            raise TransportError(f"rank {peer} is not in this process group", peer)
        self._pending.append((work, payload, peer))

    def recv(
        self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, direction: Direction
    ) -> torch.Tensor:
        """Receive a ``shape`` tensor from ``peer``, waiting until it has arrived.

        Uses the channel's pre-posted receive if :meth:`expect` announced one, else posts it now.

        Raises:
            TransportError: the receive failed or timed out (the process group's timeout), or it
                does not match the announced one.
        """
        channel = (peer, direction)
        posted = self._posted.get(channel)
        if posted:
            buffer, work = posted.popleft()
            if tuple(buffer.shape) != tuple(shape) or buffer.dtype != dtype:
                raise TransportError(f"expected a {tuple(buffer.shape)} message from rank {peer}, "
                                     f"the program receives {tuple(shape)}", peer)
            self._post_next(channel)
        else:
            buffer, work = self._irecv(shape, dtype, peer, direction)
        try:
            if work is not None:
                work.wait()
        except RuntimeError as e:
            raise TransportError(f"receiving {direction.name.lower()}s from rank {peer} failed: {e}", peer) from e
        return buffer.to(self.device) if self.host_staged else buffer

    def _wait_window(self, peer: int, window: int) -> None:
        """Wait for the oldest sends to ``peer`` until fewer than ``window`` are outstanding."""
        mine = [i for i, (_, _, p) in enumerate(self._pending) if p == peer]
        done = set(mine[:max(0, len(mine) - window + 1)])
        for i in sorted(done):
            work, _, _ = self._pending[i]
            try:
                work.wait()
            except RuntimeError as e:
                raise TransportError(f"sending to rank {peer} failed: {e}", peer) from e
        self._pending = [entry for i, entry in enumerate(self._pending) if i not in done]

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    def wait_sends(self, keep: int = 0) -> None:
        """Wait for every posted send but the first ``keep``; afterwards their tensors may be freed or reused.

        ``keep``: sends posted before some point (an evaluation) that their receivers only take later
        (an asynchronous run's gradients, received in the peer's next step).

        Raises:
            TransportError: a send failed (the receiver died) or timed out.
        """
        self._pending, pending = self._pending[:keep], self._pending[keep:]
        for work, _payload, peer in pending:
            try:
                work.wait()
            except RuntimeError as e:
                raise TransportError(f"sending to rank {peer} failed: {e}", peer) from e
