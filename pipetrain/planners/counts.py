"""Which equal micro-batch counts the planners try."""

from __future__ import annotations

__all__ = ["candidate_counts", "thinned_counts"]


def candidate_counts(batch_size: int, limit: int = 64, smallest: int = 1) -> list[int]:
    """Micro-batch counts worth simulating: 1..limit and the powers of two up to the batch, each
    giving micro-batches of ``smallest`` samples or more (a model with BatchNorm: 2,
    :attr:`~pipetrain.planners.contract.ModelRef.smallest_microbatch`)."""
    counts = set(range(1, min(batch_size, limit) + 1))
    p = 1
    while p <= batch_size:
        counts.add(p)
        p *= 2
    counts.add(batch_size)
    return sorted(m for m in counts if batch_size // m >= smallest)


def thinned_counts(batch_size: int, smallest: int = 1) -> list[int]:
    """:func:`candidate_counts` (micro-batches of ``smallest`` samples or more), keeping for each
    largest micro-batch size ``ceil(B / m)`` only the smallest ``m``: more micro-batches of the same
    largest size only add per-action overhead, and
    under BaPipe's ``(m + S - 1) · max_k`` (docs/algorithms.md §4.2) they are never faster."""
    fewest: dict[int, int] = {}
    for m in candidate_counts(batch_size, smallest=smallest):
        fewest.setdefault(-(-batch_size // m), m)
    return sorted(fewest.values())
