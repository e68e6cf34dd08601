"""Generation 0's equal seeds: vectorised construction, the lower bound, and pruning that changes nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.plan.plan import equal_sizes
from pipetrain.planners.microbatch.encoding import BoolArray, cap_cuts, cuts_to_partition, equal_seeds, sizes_to_cuts
from pipetrain.planners.microbatch.seeding import fastest_seeds, seed_bounds
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import StageTables, iteration_times
from tests.unit.test_vectorised import FloatArray, random_tables


@given(st.integers(1, 3), st.integers(1, 70))
def test_equal_seeds_match_equal_sizes(n_stages: int, batch: int) -> None:
    seeds = equal_seeds(n_stages, batch)
    expected = np.stack([sizes_to_cuts(equal_sizes(batch, m), batch) for m in range(1, batch + 1)])
    assert seeds.shape == (batch, n_stages, batch)
    assert np.array_equal(seeds, np.repeat(expected[:, None], n_stages, axis=1))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 40), st.booleans())
def test_pruned_seeds_equal_timing_every_seed(seed: int, n_stages: int, batch: int, capped: bool) -> None:
    """Arbitrary tables (some with column 0 set, never read), with or without caps, every ``keep``:
    the bound never exceeds a time, and the pruned search keeps the seeds and times of the full one."""
    rng = np.random.default_rng(seed)
    tables = random_tables(rng, n_stages, batch)
    caps = [int(c) for c in rng.integers(1, batch + 1, size=n_stages)] if capped else None
    seeds = cap_cuts(equal_seeds(n_stages, batch), caps)

    def evaluate(forward: BoolArray, backward: BoolArray) -> FloatArray:
        return iteration_times(forward, backward, tables)

    times = evaluate(seeds, seeds)
    bounds = seed_bounds(seeds, tables)
    assert np.all(bounds <= times)
    for keep in {1, int(rng.integers(1, batch + 1)), batch}:
        full_keep, full_times = fastest_seeds(seeds, keep, evaluate)
        assert full_keep.tolist() == np.argsort(times, kind="stable")[:keep].tolist()
        assert full_times.tolist() == times[full_keep].tolist()
        pruned_keep, pruned_times = fastest_seeds(seeds, keep, evaluate, bounds)
        assert pruned_keep.tolist() == full_keep.tolist()
        assert pruned_times.tolist() == full_times.tolist()
    k0 = int(np.argmin(times))
    assert times[k0] == iteration_time(cuts_to_partition(seeds[k0]), cuts_to_partition(seeds[k0]), tables)


def test_pruning_times_few_seeds_when_micro_batches_cost_overhead() -> None:
    """f(b) = 1 + 0.1 b on 4 stages, B = 64, keep 8: few-micro-batch plans win and the many-micro-batch
    ones are ruled out by the bound without being timed."""
    n_stages, batch = 4, 64
    b = np.arange(batch + 1, dtype=np.float64)
    f = np.where(b > 0, 1.0 + 0.1 * b, 0.0) * np.ones((n_stages, 1))
    tables = StageTables(f, 2 * f, 0.1 * f, 0.1 * f)
    seeds = equal_seeds(n_stages, batch)
    timed: list[int] = []

    def evaluate(forward: BoolArray, backward: BoolArray) -> FloatArray:
        timed.extend([int(np.count_nonzero(row)) for row in forward[:, 0]])
        return iteration_times(forward, backward, tables)

    keep, times = fastest_seeds(seeds, 8, evaluate, seed_bounds(seeds, tables))
    pruned = sorted(timed)
    assert (keep.tolist(), times.tolist()) == tuple(x.tolist() for x in fastest_seeds(seeds, 8, evaluate))
    assert len(pruned) < batch // 2
    assert pruned == list(range(1, len(pruned) + 1))  # the fewest micro-batches; the rest never timed
