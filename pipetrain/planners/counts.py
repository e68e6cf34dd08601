"""Which equal micro-batch counts the planners try."""

from __future__ import annotations

__all__ = ["candidate_counts", "thinned_counts"]


def candidate_counts(batch_size: int, limit: int = 64) -> list[int]:
    """Micro-batch counts worth simulating: 1..limit and the powers of two up to the batch."""
    counts = set(range(1, min(batch_size, limit) + 1))
    p = 1
    while p <= batch_size:
        counts.add(p)
        p *= 2
    counts.add(batch_size)
    return sorted(counts)


def thinned_counts(batch_size: int) -> list[int]:
    """:func:`candidate_counts`, keeping for each largest micro-batch size ``ceil(B / m)`` only the
    smallest ``m``: more micro-batches of the same largest size only add per-action overhead, and
    under BaPipe's ``(m + S - 1) · max_k`` (docs/algorithms.md §4.2) they are never faster."""
    smallest: dict[int, int] = {}
    for m in candidate_counts(batch_size):
        smallest.setdefault(-(-batch_size // m), m)
    return sorted(smallest.values())
