"""Each directed link on its own process group (gloo, :meth:`Transport.open_links`): both directions
between two ranks carry messages at once, tags kept apart, and a link opened twice is one group."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

from pipetrain.runtime.interp.transport import Direction, Transport
from pipetrain.schedule.prepost import Prepost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _exchange(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        transport, peer = Transport(torch.device("cpu")), 1 - rank
        transport.open_links([(0, 1), (1, 0)])
        transport.open_links([(0, 1), (1, 0)])  # kept: no new group, no collective mismatch
        links = transport.links
        groups = {link: dist.get_process_group_ranks(group) for link, group in links.items()}
        distinct = links[(0, 1)] is not links[(1, 0)]
        one_each = Prepost((((peer, "F"), 1), ((peer, "B"), 1)))  # one receive posted ahead per channel
        transport.expect([((4,), torch.float32, peer, Direction.ACTIVATION),
                          ((2,), torch.float32, peer, Direction.GRADIENT)], one_each)
        for k in range(3):  # both ranks send first, then receive: the two directions in flight together
            transport.send(torch.full((4,), 10.0 * rank + k), peer, Direction.ACTIVATION)
            transport.send(torch.full((2,), -10.0 * rank - k), peer, Direction.GRADIENT)
        received = [(transport.recv((4,), torch.float32, peer, Direction.ACTIVATION).tolist(),
                     transport.recv((2,), torch.float32, peer, Direction.GRADIENT).tolist()) for _ in range(3)]
        transport.wait_sends()
        torch.save({"groups": groups, "distinct": distinct, "received": received}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _on_two_ranks(worker: Callable[[int, int, str], None], tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``worker(rank, port, out)`` on two gloo ranks; what each saved to ``out.<rank>``, by rank."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = str(tmp_path / "result")
    spawn(worker, args=(port, out), nprocs=2, join=True)
    return [torch.load(f"{out}.{rank}") for rank in (0, 1)]


def test_each_direction_has_its_own_group_and_messages_arrive(tmp_path: Path) -> None:
    for rank, result in enumerate(_on_two_ranks(_exchange, tmp_path)):
        assert result["groups"] == {(0, 1): [0, 1], (1, 0): [0, 1]} and result["distinct"]
        peer = 1 - rank
        assert result["received"] == [([10.0 * peer + k] * 4, [-10.0 * peer - k] * 2) for k in range(3)]


def _untagged(rank: int, port: int, out: str) -> None:
    """NCCL's case on gloo: no tags, so each direction of a link needs its own group. Rank 0 posts its
    gradient receive before it sends (pre-posting), and the link 1 -> 0 carries both directions (a
    looping placement): one untagged group per link would match the activation with the gradient's receive."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        transport = Transport(torch.device("cpu"), use_tags=False, host_staged=True)  # staging: a no-op on a CPU
        transport.open_links([(0, 1), (1, 0)])
        channels = {(src, dst, int(d)): dist.get_process_group_ranks(group)
                    for (src, dst, d), group in transport.channels.items()}
        if rank == 0:
            transport.expect([((2,), torch.float32, 1, Direction.GRADIENT),
                              ((3,), torch.float32, 1, Direction.ACTIVATION)],
                             Prepost((((1, "B"), 1), ((1, "F"), 1))))
            transport.send(torch.full((3,), 1.0), 1, Direction.ACTIVATION)
            got = [transport.recv((3,), torch.float32, 1, Direction.ACTIVATION).tolist(),
                   transport.recv((2,), torch.float32, 1, Direction.GRADIENT).tolist()]
        else:
            x = transport.recv((3,), torch.float32, 0, Direction.ACTIVATION)
            transport.send(x + 1, 0, Direction.ACTIVATION)  # sent first, its receive posted second
            transport.send(-x[:2], 0, Direction.GRADIENT)
            got = [x.tolist()]
        transport.wait_sends()
        torch.save({"channels": channels, "links": len(transport.links), "got": got}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_without_tags_each_direction_of_a_link_has_its_own_group(tmp_path: Path) -> None:
    zero, one = _on_two_ranks(_untagged, tmp_path)
    assert zero["links"] == 0
    assert zero["channels"] == {(src, dst, d): [0, 1] for src, dst in ((0, 1), (1, 0)) for d in (0, 1)}
    assert one["got"] == [[1.0] * 3]
    assert zero["got"] == [[2.0] * 3, [-1.0] * 2]
