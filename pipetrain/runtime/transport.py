"""Point-to-point messages between stages over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

No shape headers travel: a receiver knows every message's shape from the plan (the sample range
times the per-sample spec of the tensor crossing the stage boundary, from
``LayerGraph.output_specs()``). Sends are posted with ``isend`` and their handles kept until
:meth:`Transport.wait_sends` (called at STEP), so a sender never waits for its receiver inside a
step; the sent tensors are kept alive and untouched until then. Receives post ``irecv`` and wait.

Activations and gradients use distinct tags (backends without tags, such as NCCL, ignore them;
on a chain each directed link carries one direction only, so nothing is ambiguous).
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.distributed as dist

__all__ = ["Direction", "Transport", "TransportError"]


class Direction(IntEnum):
    """What a message carries; the value is its tag."""

    ACTIVATION = 0  # forward: a stage's output activations to its successor
    GRADIENT = 1  # backward: a stage's input gradients to its predecessor


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
        device: where received tensors are allocated (``cpu`` for gloo, ``cuda:i`` for NCCL).
        use_tags: pass :class:`Direction` tags (gloo); NCCL ignores tags, so this may be off.
    """

    def __init__(self, device: torch.device, *, use_tags: bool = True) -> None:
        self.device = device
        self.use_tags = use_tags
        self._pending: list[tuple[dist.Work, torch.Tensor, int]] = []

    def send(self, tensor: torch.Tensor, peer: int, direction: Direction) -> None:
        """Post a send of ``tensor`` (made contiguous) to ``peer``; returns without waiting."""
        payload = tensor.detach().contiguous()
        tag = int(direction) if self.use_tags else 0
        try:
            work = dist.isend(payload, peer, tag=tag)
        except RuntimeError as e:
            raise TransportError(f"posting a send to rank {peer} failed: {e}", peer) from e
        if work is None:  # pragma: no cover - only when this rank is not in the group
            raise TransportError(f"rank {peer} is not in this process group", peer)
        self._pending.append((work, payload, peer))

    def recv(
        self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, direction: Direction
    ) -> torch.Tensor:
        """Receive a ``shape`` tensor from ``peer``, waiting until it has arrived.

        Raises:
            TransportError: the receive failed or timed out (the process group's timeout).
        """
        buffer = torch.empty(shape, dtype=dtype, device=self.device)
        tag = int(direction) if self.use_tags else 0
        try:
            work = dist.irecv(buffer, peer, tag=tag)
            if work is not None:
                work.wait()
        except RuntimeError as e:
            raise TransportError(f"receiving {direction.name.lower()}s from rank {peer} failed: {e}", peer) from e
        return buffer

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    def wait_sends(self) -> None:
        """Wait for every posted send; afterwards their tensors may be freed or reused.

        Raises:
            TransportError: a send failed (the receiver died) or timed out.
        """
        pending, self._pending = self._pending, []
        for work, _payload, peer in pending:
            try:
                work.wait()
            except RuntimeError as e:
                raise TransportError(f"sending to rank {peer} failed: {e}", peer) from e
