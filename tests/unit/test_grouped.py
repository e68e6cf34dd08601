"""Width groups for TiDGAP's population evaluator: a partition of the plans, and the same bits."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.planners.microbatch.encoding import partition_to_cuts
from pipetrain.simulate.grouped import population_times, width_groups
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import iteration_times
from tests.unit.test_vectorised import random_backward, random_partition, random_tables


@given(st.lists(st.integers(0, 300), min_size=1, max_size=60), st.integers(0, 5000))
def test_width_groups_partition_the_plans(widths: list[int], call_cells: int) -> None:
    groups = width_groups(np.array(widths, dtype=np.intp), call_cells)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(widths)))
    assert all(np.all(np.diff(g) > 0) for g in groups)
    cells = sum(len(g) * (max(widths[i] for i in g) + 1) + call_cells for g in groups) - call_cells
    assert cells <= len(widths) * (max(widths) + 1)  # a split is made only where it pays


def test_one_wide_plan_among_narrow_ones_is_split_off() -> None:
    groups = width_groups(np.array([3, 200, 2, 4, 3] * 20, dtype=np.intp), 500)
    assert [len(g) for g in sorted(groups, key=len)] == [20, 80]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 40), st.integers(1, 12), st.booleans())
def test_grouped_times_are_the_one_call_times(seed: int, n: int, batch: int, plans: int, shared: bool) -> None:
    """Random widths (one micro-batch to all ones), forced into several groups: the same bits as one
    call and as the loop evaluator, for shared (``backward is forward``) and separate chromosomes."""
    rng = np.random.default_rng(seed)
    tables = random_tables(rng, n, batch)
    forwards = [random_partition(rng, n, batch) for _ in range(plans)]
    backwards = forwards if shared else [random_backward(rng, f, batch) for f in forwards]
    fwd = np.stack([partition_to_cuts(f, batch) for f in forwards])
    bwd = fwd if shared else np.stack([partition_to_cuts(b, batch) for b in backwards])
    times = population_times(fwd, bwd, tables, call_cells=0)
    assert times.tolist() == iteration_times(fwd, bwd, tables).tolist()
    assert times.tolist() == [iteration_time(f, b, tables) for f, b in zip(forwards, backwards, strict=True)]
