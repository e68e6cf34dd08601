"""Pure unit tests of the re-chunking buffer (level a)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.plan.plan import ranges
from pipetrain.runtime.interp.buffers import ChunkBuffer


def _filled(sizes: list[int], data: torch.Tensor) -> ChunkBuffer:
    buffer = ChunkBuffer("test")
    for lo, hi in ranges(sizes):
        buffer.put(lo, hi, data[lo:hi])
    return buffer


def test_equal_partitions_return_the_stored_chunk() -> None:
    data = torch.arange(12.0).view(6, 2)
    buffer = _filled([3, 3], data)
    chunk = buffer.take(0, 3)
    assert chunk.data_ptr() == data.data_ptr()  # no copy
    assert buffer.ranges() == [(3, 6)]


def test_take_joins_and_slices() -> None:
    data = torch.arange(12.0)
    buffer = _filled([6, 6], data)
    assert buffer.take(0, 4).tolist() == list(range(4))
    assert buffer.take(4, 8).tolist() == [4, 5, 6, 7]
    assert buffer.ranges() == [(8, 12)]
    assert buffer.take(8, 12).tolist() == [8, 9, 10, 11]
    assert len(buffer) == 0


def test_take_from_the_middle_keeps_both_ends() -> None:
    buffer = _filled([10], torch.arange(10.0))
    assert buffer.take(3, 5).tolist() == [3, 4]
    assert buffer.ranges() == [(0, 3), (5, 10)]


def test_missing_samples_name_what_is_stored() -> None:
    buffer = _filled([2, 2], torch.arange(4.0))
    buffer.take(2, 4)
    with pytest.raises(KeyError, match=r"\[0:3\) are not all stored; have \[\(0, 2\)\]"):
        buffer.take(0, 3)
    assert buffer.ranges() == [(0, 2)]  # a failed take removes nothing


def test_overlap_and_wrong_size_are_rejected() -> None:
    buffer = _filled([4], torch.arange(4.0))
    with pytest.raises(ValueError, match="overlaps"):
        buffer.put(3, 5, torch.zeros(2))
    with pytest.raises(ValueError, match="2 samples stored as range"):
        buffer.put(4, 7, torch.zeros(2))


def test_out_of_order_arrival() -> None:
    buffer = ChunkBuffer("test")
    buffer.put(4, 8, torch.arange(4.0, 8.0))
    buffer.put(0, 4, torch.arange(4.0))
    assert buffer.take(2, 6).tolist() == [2, 3, 4, 5]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
)
def test_any_two_partitions_rechunk_exactly(put_sizes: list[int], take_sizes: list[int]) -> None:
    """Whatever the sender's and the receiver's partitions, the samples come back in order."""
    n = min(sum(put_sizes), sum(take_sizes))
    put_sizes = _trim(put_sizes, n)
    take_sizes = _trim(take_sizes, n)
    data = torch.randn(n, 3)
    buffer = _filled(put_sizes, data)
    parts = [buffer.take(lo, hi) for lo, hi in ranges(take_sizes)]
    torch.testing.assert_close(torch.cat(parts), data, rtol=0, atol=0)
    assert len(buffer) == 0


def _trim(sizes: list[int], total: int) -> list[int]:
    """Cut the size vector so that it sums to ``total``."""
    out = []
    for end, size in zip(itertools.accumulate(sizes), sizes, strict=True):
        out.append(size - max(0, end - total))
        if end >= total:
            break
    return out
