"""The schedule's instruction: one frozen :class:`Action` per thing a rank does.

Every action names the sample range ``[lo, hi)`` of the mini-batch it covers, so unequal
micro-batches, re-chunking between stages with different partitions, replicated stages and DAG edges
all use the same record (docs/architecture.md §2).

Text form (extends torch's ``2F0``; ``str`` and :meth:`Action.parse` are exact inverses)::

    2F0[0:16]            stage 2, forward, micro-batch 0, samples 0..15
    1B3[48:64]           stage 1, backward of micro-batch 3
    0SEND_F1[16:32]>1    stage 0 sends micro-batch 1's activations to rank 1
    1RECV_F1[16:32]<0    stage 1 receives them from rank 0
    0STEP                stage 0 applies its optimizer step
    2F0[0:16]v3          with weight version 3 (asynchronous methods)

For communication actions, ``microbatch`` and the range name the *message*: the sending stage's
micro-batch. A receiver whose own partition differs re-chunks by sample range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal

__all__ = ["COMM_KINDS", "COMPUTE_KINDS", "Action", "ActionKind"]


class ActionKind(str, Enum):
    """What an action does. One line of semantics each."""

    F = "F"  # forward of the stage's layers on the range; keeps what backward needs
    B = "B"  # backward on the range: input gradients and (unless W is split off) weight gradients
    W = "W"  # weight-gradient part of a split backward
    SEND_F = "SEND_F"  # send the range's output activations to `peer`
    RECV_F = "RECV_F"  # receive the range's input activations from `peer`
    SEND_B = "SEND_B"  # send the range's input gradients to `peer`
    RECV_B = "RECV_B"  # receive the range's output gradients from `peer`
    STEP = "STEP"  # optimizer step (all-reduce first for replicated stages)


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.W})
COMM_KINDS = frozenset({ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B})
_SENDS = frozenset({ActionKind.SEND_F, ActionKind.SEND_B})
_CHANNELS: dict[ActionKind, Literal["F", "B"]] = {
    ActionKind.SEND_F: "F",
    ActionKind.RECV_F: "F",
    ActionKind.SEND_B: "B",
    ActionKind.RECV_B: "B",
}

_PATTERN = re.compile(
    r"^(?P<stage>\d+)(?P<kind>SEND_F|RECV_F|SEND_B|RECV_B|STEP|F|B|W)"
    r"(?P<mb>\d+)?(?:\[(?P<lo>\d+):(?P<hi>\d+)\])?"
    r"(?:(?P<dir>[<>])(?P<peer>\d+))?(?:v(?P<version>\d+))?$"
)


@dataclass(frozen=True, slots=True)
class Action:
    """One instruction of a rank's program.

    Attributes:
        kind: what to do.
        stage: the stage (of the Plan) that performs the action.
        microbatch: index in the performing stage's partition (for communication: the message's
            index in the *sending* stage's partition); ``-1`` for STEP.
        lo: first sample of the range (inclusive), in mini-batch order.
        hi: end of the range (exclusive); ``hi > lo`` except for STEP (``lo == hi == 0``).
        peer: the other rank, for communication actions only.
        version: weight version, for asynchronous methods only.
    """

    kind: ActionKind
    stage: int
    microbatch: int = -1
    lo: int = 0
    hi: int = 0
    peer: int | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        if self.stage < 0:
            raise ValueError(f"stage must be >= 0, got {self.stage}")
        if self.kind is ActionKind.STEP:
            if (self.microbatch, self.lo, self.hi, self.peer) != (-1, 0, 0, None):
                raise ValueError("STEP takes no micro-batch, sample range or peer")
            return
        if self.microbatch < 0 or not 0 <= self.lo < self.hi:
            raise ValueError(f"{self.kind.value} needs micro-batch >= 0 and 0 <= lo < hi")
        if (self.kind in COMM_KINDS) != (self.peer is not None):
            raise ValueError(f"{self.kind.value}: peer is required for communication only")

    @property
    def size(self) -> int:
        """Number of samples the action covers."""
        return self.hi - self.lo

    @property
    def is_send(self) -> bool:
        return self.kind in _SENDS

    @property
    def channel(self) -> Literal["F", "B"]:
        """Direction of a communication action's message: ``"F"`` for activations (SEND_F, RECV_F),
        ``"B"`` for gradients (SEND_B, RECV_B).

        A send and the receive that matches it have the same channel, so ``(src, dst, channel)``
        names one in-order message queue between two ranks.

        Raises:
            ValueError: the action is not a communication action.
        """
        try:
            return _CHANNELS[self.kind]
        except KeyError:
            raise ValueError(f"{self.kind.value} is not a communication action; it has no channel") from None

    def __str__(self) -> str:
        if self.kind is ActionKind.STEP:
            text = f"{self.stage}STEP"
        else:
            text = f"{self.stage}{self.kind.value}{self.microbatch}[{self.lo}:{self.hi}]"
        if self.peer is not None:
            text += (">" if self.is_send else "<") + str(self.peer)
        if self.version is not None:
            text += f"v{self.version}"
        return text

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse the text form; the exact inverse of ``str``.

        Raises:
            ValueError: the text is not an action, with the expected form in the message.
        """
        match = _PATTERN.match(text.strip())
        if match is None:
            raise ValueError(
                f"cannot parse action {text!r}; expected e.g. '2F0[0:16]', '0SEND_F1[16:32]>1', '0STEP'"
            )
        kind = ActionKind(match["kind"])
        peer = match["peer"]
        if peer is not None and (match["dir"] == ">") != (kind in _SENDS):
            raise ValueError(f"action {text!r}: sends use '>peer', receives use '<peer'")
        action = cls(
            kind=kind,
            stage=int(match["stage"]),
            microbatch=int(match["mb"]) if match["mb"] is not None else -1,
            lo=int(match["lo"] or 0),
            hi=int(match["hi"] or 0),
            peer=int(peer) if peer is not None else None,
            version=int(match["version"]) if match["version"] is not None else None,
        )
        if str(action) != text.strip():
            raise ValueError(f"action {text!r} is not in canonical form; write {str(action)!r}")
        return action
