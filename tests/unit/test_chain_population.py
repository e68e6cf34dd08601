"""The population evaluator of unequal 1F1B / ZB-H1 plans equals the one-plan loops to the last bit."""

from __future__ import annotations

import numpy as np
import pytest

from pipetrain.planners.microbatch.encoding import cuts_to_partition, equal_seeds
from pipetrain.planners.microbatch.seeding import fastest_seeds, seed_bounds
from pipetrain.schedule.one_f_one_b import one_f_one_b_sequences
from pipetrain.schedule.zero_bubble import zb1_sequences
from pipetrain.simulate.chain import order_time, split_order_time
from pipetrain.simulate.chain_population import population_order_times
from pipetrain.simulate.stage_tables import StageTables


def _tables(rng: np.random.Generator, n_stages: int, batch: int) -> StageTables:
    """Random affine-ish costs with per-micro-batch overheads and links slower or faster than compute."""
    def table(scale: float = 1.0) -> np.ndarray:
        sizes = np.arange(batch + 1) ** rng.uniform(0.3, 1.0)
        return scale * rng.uniform(0.1, 2.0, (n_stages, batch + 1)) * sizes + rng.uniform(0, 0.5, (n_stages, 1))
    return StageTables(table(), table(), table(rng.uniform(0, 2)), table(rng.uniform(0, 2)),
                       rng.uniform(0, 1, n_stages), backward_input_s=table(), weight_grad_s=table())


def _one_at_a_time(cuts: np.ndarray, tables: StageTables, split: bool) -> list[float]:
    out = []
    for plan in cuts:
        sizes = cuts_to_partition(plan)
        orders = one_f_one_b_sequences(sizes)
        out.append(split_order_time(zb1_sequences(orders), sizes, tables) if split
                   else order_time(orders, sizes, sizes, tables))
    return out


@pytest.mark.parametrize("split", [False, True])
def test_random_populations_equal_the_loops_exactly(split: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(60):
        n_stages, batch, n_plans = int(rng.integers(1, 7)), int(rng.integers(1, 30)), int(rng.integers(1, 6))
        tables = _tables(rng, n_stages, batch)
        cuts = rng.random((n_plans, n_stages, batch)) < rng.uniform(0.05, 1.0, (n_plans, n_stages, 1))
        cuts[..., -1] = True
        assert population_order_times(cuts, tables, split).tolist() == _one_at_a_time(cuts, tables, split)


@pytest.mark.parametrize("split", [False, True])
def test_equal_seeds_equal_the_loops_exactly(split: bool) -> None:
    rng = np.random.default_rng(3)
    tables = _tables(rng, 4, 24)
    seeds = equal_seeds(4, 24)  # 1 .. 24 micro-batches on every stage
    assert population_order_times(seeds, tables, split).tolist() == _one_at_a_time(seeds, tables, split)


def test_bad_masks_and_tables_are_refused() -> None:
    rng = np.random.default_rng(0)
    tables = _tables(rng, 3, 8)
    cuts = np.ones((2, 3, 8), dtype=bool)
    with pytest.raises(ValueError, match="cut masks"):
        population_order_times(cuts[:, :2], tables)
    cuts[0, 1, -1] = False
    with pytest.raises(ValueError, match="ending in a cut"):
        population_order_times(cuts, tables)
    plain = StageTables(tables.forward_s, tables.backward_s, tables.send_forward_s, tables.send_backward_s)
    with pytest.raises(ValueError, match="split backward"):
        population_order_times(np.ones((1, 3, 8), dtype=bool), plain, split=True)


@pytest.mark.parametrize("split", [False, True])
def test_seed_bound_holds_under_the_orders_so_pruning_keeps_the_seeds(split: bool) -> None:
    """The seeds' bound (busy time of a stage, ``f + B + W`` when split) is below every 1F1B / ZB-H1 time,
    so the GA's pruned seeding keeps the seeds and times of timing them all."""
    rng = np.random.default_rng(11)
    for _ in range(4):
        tables = _tables(rng, int(rng.integers(1, 5)), int(rng.integers(2, 26)))
        seeds = equal_seeds(tables.n_stages, tables.batch_size)
        times = population_order_times(seeds, tables, split)
        bounds = seed_bounds(seeds, tables, split)
        assert np.all(bounds <= times)

        def evaluate(forward: np.ndarray, _: np.ndarray, tables: StageTables = tables) -> np.ndarray:
            return population_order_times(forward, tables, split)

        keep = max(1, tables.batch_size // 3)
        full, pruned = fastest_seeds(seeds, keep, evaluate), fastest_seeds(seeds, keep, evaluate, bounds)
        assert [a.tolist() for a in full] == [a.tolist() for a in pruned]
