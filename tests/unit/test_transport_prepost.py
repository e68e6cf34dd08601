"""Pre-posted receives (:meth:`Transport.expect`, as the pass :mod:`pipetrain.schedule.prepost` decides):
``PREPOSTED`` per channel at least, as many more as fit the budget (gloo), local learning's queue
depth exactly; one posted per receive taken."""

from __future__ import annotations

import pytest
import torch

from pipetrain.runtime.interp.transport import Direction, Message, Transport, message_bytes
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.prepost import PREPOSTED, prepost_program

ACT, GRAD = Direction.ACTIVATION, Direction.GRADIENT


class _Recorder(Transport):
    """A transport whose receives are recorded instead of posted (no process group)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.posted: list[tuple[int, Direction, int]] = []  # peer, direction, first element's index

    def _irecv(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int,
               direction: Direction) -> tuple[torch.Tensor, None]:
        self.posted.append((peer, direction, shape[0]))
        return torch.empty(shape, dtype=dtype), None


def _messages(n_act: int, n_grad: int, floats: int = 100) -> list[Message]:
    """``n_act`` activations from rank 0 and ``n_grad`` gradients from rank 1, in program order; each
    message's length tells it apart (``floats + i``)."""
    acts: list[Message] = [((floats + i,), torch.float32, 0, ACT) for i in range(n_act)]
    grads: list[Message] = [((floats + i,), torch.float32, 1, GRAD) for i in range(n_grad)]
    return acts + grads


def _expect(transport: Transport, messages: list[Message], budget: int, bound: int | None = None) -> None:
    """:meth:`Transport.expect` with the pass's pre-posting of the messages' receives (one RECV each)."""
    program = [Action(ActionKind.RECV_F if d is ACT else ActionKind.RECV_B, 1, i, 0, shape[0], peer=peer)
               for i, (shape, _, peer, d) in enumerate(messages)]
    sizes = {a: message_bytes(m) for a, m in zip(program, messages, strict=True)}
    transport.expect(messages, prepost_program(program, sizes.__getitem__, budget, bound))


def test_without_a_budget_each_channel_keeps_preposted_receives() -> None:
    transport = _Recorder()
    _expect(transport, _messages(5, 3), budget=0)
    assert transport.posted == [(0, ACT, 100), (0, ACT, 101), (1, GRAD, 100), (1, GRAD, 101)]
    assert PREPOSTED == 2
    transport.recv((100,), torch.float32, 0, ACT)  # taking one posts the channel's next
    assert transport.posted[-1] == (0, ACT, 102) and len(transport.posted) == 5


def test_a_large_budget_posts_every_receive_of_the_step_in_channel_order() -> None:
    transport = _Recorder()
    _expect(transport, _messages(5, 3), budget=2**20)
    assert transport.posted == [(0, ACT, 100 + i) for i in range(5)] + [(1, GRAD, 100 + i) for i in range(3)]
    for i in range(5):  # every receive is served from its posted buffer, in order, nothing posted again
        assert transport.recv((100 + i,), torch.float32, 0, ACT).shape == (100 + i,)
    assert len(transport.posted) == 8


FIRST_THREE = 2 * (100 + 101 + 102) * 4  # bytes of the first 3 messages of both channels (float32)


@pytest.mark.parametrize(("budget", "depth"), [(FIRST_THREE, 3), (FIRST_THREE - 1, 2)])
def test_the_budget_counts_the_first_messages_of_every_channel_together(budget: int, depth: int) -> None:
    transport = _Recorder()
    _expect(transport, _messages(5, 5), budget)
    assert len(transport.posted) == 2 * depth
    assert [p for p in transport.posted if p[1] is ACT] == [(0, ACT, 100 + i) for i in range(depth)]


def test_local_learning_queues_keep_their_depth_whatever_the_budget() -> None:
    transport = _Recorder()
    _expect(transport, _messages(4, 4), budget=2**30, bound=1)
    assert transport.posted == [(0, ACT, 100), (1, GRAD, 100)]
    _expect(transport, _messages(4, 4), budget=2**30)  # back to the default: the budget applies again
    assert len(transport.posted) == 2 + 8
