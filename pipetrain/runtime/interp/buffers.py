"""Tensors keyed by sample range, so a stage can re-chunk what it receives.

Every message names the samples ``[lo, hi)`` it carries. A receiver stores the chunks as they
arrive and takes back exactly the range its own action needs, whatever partition the sender used::

    sender partition    [0:6)      [6:12)
    receiver F ranges   [0:4)  [4:8)  [8:12)
    take(4, 8) = cat(chunk[0:6)[4:6], chunk[6:12)[0:2])

With equal partitions on both sides every ``take`` returns one stored chunk unchanged.
"""

from __future__ import annotations

from bisect import bisect_right, insort

import torch

__all__ = ["ChunkBuffer"]


class ChunkBuffer:
    """Disjoint tensors ``[hi - lo, *feature]`` keyed by their sample range ``[lo, hi)``.

    Args:
        name: what the buffer holds (for error messages), e.g. ``"input activations"``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._starts: list[int] = []
        self._chunks: dict[int, tuple[int, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._chunks)

    def ranges(self) -> list[tuple[int, int]]:
        """The stored ranges, in sample order."""
        return [(lo, self._chunks[lo][0]) for lo in self._starts]

    def put(self, lo: int, hi: int, tensor: torch.Tensor) -> None:
        """Store ``tensor`` (``[hi - lo, ...]``) as the samples ``[lo, hi)``.

        Raises:
            ValueError: the first dimension is not ``hi - lo``, or the range overlaps a stored one.
        """
        if tensor.shape[0] != hi - lo or lo >= hi:
            raise ValueError(
                f"{self.name}: tensor of {tensor.shape[0]} samples stored as range [{lo}:{hi})"
            )
        i = bisect_right(self._starts, lo)
        before_hi = self._chunks[self._starts[i - 1]][0] if i > 0 else lo
        after_lo = self._starts[i] if i < len(self._starts) else hi
        if before_hi > lo or after_lo < hi:
            raise ValueError(f"{self.name}: range [{lo}:{hi}) overlaps {self.ranges()}")
        insort(self._starts, lo)
        self._chunks[lo] = (hi, tensor)

    def take(self, lo: int, hi: int) -> torch.Tensor:
        """Remove and return the samples ``[lo, hi)``: one chunk, a slice, or a concatenation.

        Parts of chunks outside ``[lo, hi)`` stay stored (as views) for later ``take`` calls.

        Raises:
            KeyError: some sample of ``[lo, hi)`` is not stored; the message lists what is.
        """
        pieces = self._covering(lo, hi)
        parts = []
        for start in pieces:
            end, tensor = self._chunks.pop(start)
            self._starts.remove(start)
            a, b = max(lo, start), min(hi, end)
            parts.append(tensor[a - start:b - start])
            if start < lo:
                self.put(start, lo, tensor[: lo - start])
            if end > hi:
                self.put(hi, end, tensor[hi - start:])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _covering(self, lo: int, hi: int) -> list[int]:
        """Starts of the stored chunks that together cover ``[lo, hi)`` without a gap."""
        i = max(bisect_right(self._starts, lo) - 1, 0)
        covered, starts = lo, []
        while covered < hi and i < len(self._starts):
            start = self._starts[i]
            end = self._chunks[start][0]
            if start > covered:
                break
            if end > covered:
                starts.append(start)
                covered = end
            i += 1
        if covered < hi or lo >= hi:
            raise KeyError(f"{self.name}: samples [{lo}:{hi}) are not all stored; have {self.ranges()}")
        return starts

    def clear(self) -> None:
        self._starts.clear()
        self._chunks.clear()
