"""The torch baseline's schedules: placements, torch's micro-batch rules and the chunk split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common.torch_schedules import SCHEDULES, chunk_layers, schedule_of


def test_every_torch_schedule_is_covered() -> None:
    import torch.distributed.pipelining as pipelining

    classes = {n for n in pipelining.__all__ if n.startswith("Schedule")}
    assert {s.class_name for s in SCHEDULES.values()} == classes


@pytest.mark.parametrize(("name", "rank0", "rank1"), [
    ("gpipe", (0,), (1,)), ("interleaved-1f1b", (0, 2), (1, 3)), ("zbv", (0, 3), (1, 2)), ("dualpipev", (0, 3), (1, 2)),
])
def test_placement(name: str, rank0: tuple[int, ...], rank1: tuple[int, ...]) -> None:
    spec = schedule_of(name)
    assert spec.rank_stages(0, 2) == rank0 and spec.rank_stages(1, 2) == rank1


def test_micro_batch_rules() -> None:
    allowed = {name: [m for m in range(1, 9) if s.allows(m, 2)] for name, s in SCHEDULES.items()}
    assert allowed["gpipe"] == allowed["looped-bfs"] == allowed["zbv"] == list(range(1, 9))
    assert allowed["1f1b"] == list(range(2, 9))
    assert allowed["interleaved-1f1b"] == allowed["interleaved-zb"] == [1, 2, 3, 4, 6, 8]
    assert allowed["dualpipev"] == list(range(4, 9))


def test_chunks_balance_ranks() -> None:
    gpt = [18432.0, 49984.0, 49984.0, 49984.0, 49984.0, 16512.0]  # embed, 4 blocks, head
    assert chunk_layers(gpt, schedule_of("1f1b"), 2) == [range(0, 3), range(3, 6)]
    assert chunk_layers(gpt, schedule_of("zbv"), 2) == [range(0, 2), range(2, 3), range(3, 4), range(4, 6)]
    assert chunk_layers(gpt, schedule_of("looped-bfs"), 2) == [range(0, 2), range(2, 3), range(3, 4), range(4, 6)]
    assert chunk_layers([1.0] * 8, schedule_of("interleaved-zb"), 2) == [range(k, k + 2) for k in range(0, 8, 2)]
    with pytest.raises(ValueError, match="cannot make 4 stages"):
        chunk_layers([1.0] * 3, schedule_of("zbv"), 2)
