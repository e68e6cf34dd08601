"""The best equal partition (EDP, i.e. GPipe's micro-batching) under the UEDP cost model.

Every stage splits the batch into the same ``m`` sizes :func:`~pipetrain.plan.plan.equal_sizes`
``(B, m)`` for forward and backward; all ``m`` in ``1..B`` (those meeting the memory caps) are timed
in one vectorised call and the fastest is kept, ties going to fewer micro-batches. Cost:
``O(K B²)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipetrain.planners.microbatch.encoding import cuts_to_partition, equal_seeds
from pipetrain.planners.microbatch.result import MicrobatchPlan, check_caps
from pipetrain.simulate.vectorised import StageTables, iteration_times

__all__ = ["best_equal"]


def best_equal(tables: StageTables, caps: Sequence[int] | None = None, smallest: int = 1) -> MicrobatchPlan:
    """The fastest equal-micro-batch plan whose micro-batches fit every stage's cap.

    Args:
        tables: stage costs ``[K, B + 1]``.
        caps: per stage, the largest micro-batch allowed; None for no cap.
        smallest: the fewest samples a micro-batch may have (a model with BatchNorm: 2).
    """
    batch = tables.batch_size
    limits = check_caps(caps, tables.n_stages)
    seeds = equal_seeds(tables.n_stages, batch)
    counts = np.arange(1, batch + 1)
    allowed = batch // counts >= smallest  # m equal sizes have at least floor(B / m) samples each
    if limits is not None:  # and at most ceil(B / m)
        allowed &= -(-batch // counts) <= min(limits)
    seeds = seeds[allowed]
    times = iteration_times(seeds, seeds, tables)
    best = int(np.argmin(times))
    partition = cuts_to_partition(seeds[best])
    return MicrobatchPlan(partition, partition, float(times[best]), "equal")
