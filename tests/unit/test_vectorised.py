"""The vectorised UEDP evaluator against a per-micro-batch loop reference and the event simulator."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Device, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.microbatch.encoding import cuts_to_partition, partition_to_cuts
from pipetrain.profile.table import LayerProfile, Profile, TiedBytes
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import _SCAN_CELLS, StageTables, _running_max, _running_sum, iteration_times

Partition = list[tuple[int, ...]]
FloatArray = npt.NDArray[np.float64]


# ---- the slow reference: PAPERS.md §1.4 written out literally -------------------------------


def _stage(ready_of_sample: list[float], sizes: tuple[int, ...], t: FloatArray, c: FloatArray,
           start: float) -> tuple[list[float], float]:
    """One stage's chain and its outgoing link: per-sample arrivals downstream and the stage's end."""
    end, link, lo, arrivals = start, float("-inf"), 0, []
    for x in sizes:
        end = max(end, ready_of_sample[lo + x - 1]) + t[x]
        link = max(link, end) + c[x]
        arrivals += [link] * x
        lo += x
    return arrivals, end


def reference_time(fwd: Partition, bwd: Partition, tables: StageTables) -> float:
    """T = max_k (BE[k, n_k] + step[k]) by the textbook recurrence ``E = max(E, r) + d``."""
    n, batch = tables.n_stages, tables.batch_size
    ready, forward_end = [0.0] * batch, []
    for k in range(n):
        ready, end = _stage(ready, fwd[k], tables.forward_s[k], tables.send_forward_s[k], 0.0)
        forward_end.append(end)
    ready, finish = [float("-inf")] * batch, []
    for k in range(n - 1, -1, -1):
        g = tables.backward_s[k] if fwd[k] == bwd[k] else tables.backward_recompute_s[k]  # PAPERS.md §1.12
        ready, end = _stage(ready, bwd[k], g, tables.send_backward_s[k], forward_end[k])
        finish.append(end + float(tables.step_s[k]))
    return max(finish)


# ---- random instances -------------------------------------------------------------------------


def random_sizes(rng: np.random.Generator, batch: int) -> tuple[int, ...]:
    """A random composition of ``batch``: sometimes one micro-batch, sometimes all ones."""
    density = rng.choice([0.0, 0.1, 0.3, 0.7, 1.0])
    cuts = rng.random(batch) < density
    cuts[-1] = True
    return cuts_to_partition(cuts[None])[0]


def random_partition(rng: np.random.Generator, n: int, batch: int) -> Partition:
    return [random_sizes(rng, batch) for _ in range(n)]


def random_backward(rng: np.random.Generator, fwd: Partition, batch: int) -> Partition:
    """Per stage, the forward sizes (no recompute) or, with p 1/2, random ones (recompute)."""
    return [x if rng.random() < 0.5 else random_sizes(rng, batch) for x in fwd]


def random_tables(rng: np.random.Generator, n: int, batch: int) -> StageTables:
    """Arbitrary non-negative tables (not necessarily monotone); column 0 is never read."""
    def table() -> FloatArray:
        t: FloatArray = rng.uniform(0.0, 2.0, size=(n, batch + 1)) * rng.choice([0.0, 1.0], p=[0.1, 0.9])
        return t
    g = table()
    return StageTables(table(), g, table(), table(), rng.uniform(0.0, 0.5, size=n), g + table())


def random_cost(rng: np.random.Generator, n: int, batch: int) -> tuple[CostModel, tuple[tuple[str, ...], ...]]:
    """A cost model from a synthetic profile on a random two-level cluster.

    Each stage has one or two layers whose costs are random on the full grid 1..batch; devices sit on
    random nodes (so links differ) and have random speeds; half the profiles tie two layers.
    """
    grid = tuple(range(1, batch + 1))
    stages, layers = [], []
    for k in range(n):
        names = tuple(f"s{k}l{i}" for i in range(int(rng.integers(1, 3))))
        stages.append(names)
        for name in names:
            alpha, beta = rng.uniform(0.0, 1.0, 2)
            sat = int(rng.integers(1, batch + 1))
            fwd = tuple(float(alpha + beta * max(b, sat) + rng.uniform(0, 0.2)) for b in grid)
            bwd = tuple(float(2 * alpha + rng.uniform(0.5, 3.0) * beta * b) for b in grid)
            layers.append(LayerProfile(name, grid, fwd, bwd, int(rng.integers(0, 5000)),
                                       int(rng.integers(0, 100)), 0, 0.0, float(rng.uniform(0, 0.3))))
    # half the instances tie the first layer to the last (an embedding and its head), summed at STEP
    tied = n > 1 and bool(rng.integers(0, 2))
    ties = (TiedBytes((stages[0][0], stages[-1][-1]), int(rng.integers(1, 5000))),) if tied else ()
    profile = Profile("random", "", "cpu", "synthetic", int(rng.integers(1, 5000)), tuple(layers), ties=ties)
    devices = tuple(Device("cpu", 1 << 30, float(rng.uniform(0.5, 2.0)), int(rng.integers(0, 2))) for _ in range(n))
    cluster = Cluster(devices, Link(float(rng.uniform(0, 0.3)), float(rng.uniform(1e3, 1e5))),
                      Link(float(rng.uniform(0, 1.0)), float(rng.uniform(1e3, 1e4))),
                      action_overhead_s=float(rng.uniform(0.0, 0.05)))
    return CostModel(profile, cluster), tuple(stages)


def uedp_plan(stages: tuple[tuple[str, ...], ...], batch: int, fwd: Partition, bwd: Partition,
              recompute: bool) -> Plan:
    return Plan("random", "", batch, Method.UEDP, tuple(
        StagePlan(layers, (k,), fwd[k], bwd[k], recompute) for k, layers in enumerate(stages)))


# ---- tests ------------------------------------------------------------------------------------


def test_gpipe_sanity_case() -> None:
    """K = 4, m = 4, f = 1, g = 2, free links: T = (m + K - 1)(f + g) = 21."""
    n, batch = 4, 4
    ones = np.ones((n, batch + 1))
    ones[:, 0] = 0.0
    zeros = np.zeros((n, batch + 1))
    tables = StageTables(ones, 2 * ones, zeros, zeros)
    sizes = [equal_sizes(batch, 4)] * n
    cuts = partition_to_cuts(sizes, batch)[None]
    assert iteration_times(cuts, cuts, tables).tolist() == [21.0]
    assert iteration_time(sizes, sizes, tables) == 21.0


def test_random_tables_against_the_loop_reference() -> None:
    """500 instances, arbitrary tables, some stages recomputing: closed form == textbook loop (1e-9),
    == its loop twin (exactly)."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        n, batch = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        tables = random_tables(rng, n, batch)
        forwards = [random_partition(rng, n, batch) for _ in range(3)]
        plans = [(f, random_backward(rng, f, batch)) for f in forwards]
        fwd = np.stack([partition_to_cuts(f, batch) for f, _ in plans])
        bwd = np.stack([partition_to_cuts(b, batch) for _, b in plans])
        fast = iteration_times(fwd, bwd, tables)
        for p, (f, b) in enumerate(plans):
            assert fast[p] == pytest.approx(reference_time(f, b, tables), rel=1e-9, abs=1e-12)
            assert fast[p] == iteration_time(f, b, tables)  # bit-identical: DGAP and TiDGAP agree


def test_a_population_wider_than_one_scan_chunk_against_the_loop() -> None:
    """400 plans on 4 stages: the duration sums span several _SCAN_CELLS chunks, and forward and
    backward masks are parsed together (some stages recomputing); every time is the loop's."""
    rng = np.random.default_rng(4)
    n, batch = 4, 24
    tables = random_tables(rng, n, batch)
    plans = [(f, random_backward(rng, f, batch)) for f in (random_partition(rng, n, batch) for _ in range(400))]
    fwd = np.stack([partition_to_cuts(f, batch) for f, _ in plans])
    bwd = np.stack([partition_to_cuts(b, batch) for _, b in plans])
    assert 2 * 2 * n * len(plans) * (fwd.sum(axis=2).max() + 1) > 2 * _SCAN_CELLS
    assert iteration_times(fwd, bwd, tables).tolist() == [iteration_time(f, b, tables) for f, b in plans]
    assert iteration_times(fwd, fwd, tables).tolist() == [iteration_time(f, f, tables) for f, _ in plans]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 20), st.integers(1, 6))
def test_shared_stages_and_shared_chromosomes_take_the_same_bits(seed: int, n: int, batch: int, plans: int) -> None:
    """Plans whose stages all share one row (read once), ``backward is forward`` (read once, no
    recompute) and any subset of a population (the GA re-uses the times of kept equal seeds) give
    exactly the loop evaluator's times."""
    rng = np.random.default_rng(seed)
    tables = random_tables(rng, n, batch)
    rows = [random_sizes(rng, batch) for _ in range(plans)]
    alike = np.stack([partition_to_cuts([sizes] * n, batch) for sizes in rows])  # [P, K, B], stages alike
    assert iteration_times(alike, alike, tables).tolist() == [iteration_time([x] * n, [x] * n, tables) for x in rows]
    mixed = np.stack([partition_to_cuts(random_partition(rng, n, batch), batch) for _ in range(plans)])
    population = np.concatenate([alike, mixed])
    times = iteration_times(population, population, tables)
    assert times.tolist() == iteration_times(population, population.copy(), tables).tolist()
    subset = rng.permutation(len(population))[: int(rng.integers(1, len(population) + 1))]
    assert iteration_times(population[subset], population[subset], tables).tolist() == times[subset].tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 70))
def test_scans_match_the_loop(seed: int, rows: int, cols: int) -> None:
    """The torch scans: sums added left to right as the loop adds them (magnitudes 1e-12 to 1e6,
    so any other order would round differently) and exact running maxima, -inf included."""
    rng = np.random.default_rng(seed)
    grid = 10.0 ** rng.uniform(-12, 6, size=(rows, cols)) * rng.choice([0.0, 1.0], size=(rows, cols), p=[0.2, 0.8])
    expected = []
    for row in grid.tolist():
        total, out = 0.0, []
        for x in row:
            total = total + x
            out.append(total)
        expected.append(out)
    ready = np.where(rng.random((rows, cols)) < 0.3, -np.inf, grid - 1e3)
    maxima = np.empty_like(ready)
    _running_max(torch.from_numpy(ready), torch.from_numpy(maxima), torch.empty(ready.shape, dtype=torch.int64))
    assert maxima.tolist() == np.maximum.accumulate(ready, axis=1).tolist()
    _running_sum(grid)
    assert grid.tolist() == expected


def test_running_sum_in_chunks() -> None:
    """A grid of more than _SCAN_CELLS cells is scanned in row chunks, each row still added left to
    right as the loop adds it."""
    rng = np.random.default_rng(3)
    grid = 10.0 ** rng.uniform(-12, 6, size=(2 * _SCAN_CELLS // 30 + 7, 30))
    expected = np.array([list(itertools.accumulate(row)) for row in grid.tolist()])
    _running_sum(grid)
    assert grid.tobytes() == expected.tobytes()


def test_cost_model_tables_against_the_event_simulator() -> None:
    """500 instances from random profiles and clusters: vectorised == simulate(build_schedule(plan))."""
    rng = np.random.default_rng(2)
    for i in range(500):
        n, batch = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        cost, stages = random_cost(rng, n, batch)
        fwd = random_partition(rng, n, batch)
        bwd = random_backward(rng, fwd, batch)
        plan = uedp_plan(stages, batch, fwd, bwd, recompute=i % 3 == 0)
        tables = StageTables.from_plan(plan, cost)
        fast = iteration_times(partition_to_cuts(fwd, batch)[None], partition_to_cuts(bwd, batch)[None], tables)
        expected = simulate(build_schedule(plan), plan, cost).iteration_s
        assert float(fast[0]) == pytest.approx(expected, rel=1e-9)


def test_one_stage_one_sample() -> None:
    f = np.array([[0.0, 3.0]])
    tables = StageTables(f, 2 * f, np.zeros((1, 2)), np.zeros((1, 2)), np.array([0.5]))
    cuts = np.ones((1, 1, 1), dtype=bool)
    assert iteration_times(cuts, cuts, tables).tolist() == [9.5]


def test_communication_is_fifo() -> None:
    """Two stages, 4 one-sample micro-batches, a slow link: arrivals 1.1, 2.1, 3.1, 4.1 (as the simulator)."""
    f = np.full((2, 5), 0.1)
    f[:, 0] = 0.0
    link = np.ones((2, 5))
    link[:, 0] = 0.0
    zeros = np.zeros((2, 5))
    tables = StageTables(f, zeros, link, zeros)
    ones = [(1, 1, 1, 1)] * 2
    # stage 1's last forward starts at 4.1 and ends at 4.2; backward costs nothing
    assert iteration_time(ones, ones, tables) == pytest.approx(4.2)


def test_rejects_bad_inputs() -> None:
    good = np.zeros((2, 4))
    with pytest.raises(ValueError, match="non-negative"):
        StageTables(good - 1.0, good, good, good)
    with pytest.raises(ValueError, match="shape"):
        StageTables(good, np.zeros((2, 5)), good, good)
    tables = StageTables(good, good, good, good)
    cuts = np.zeros((1, 2, 3), dtype=bool)
    with pytest.raises(ValueError, match="last micro-batch"):
        iteration_times(cuts, cuts, tables)
    with pytest.raises(ValueError, match="sum to the batch"):
        iteration_time([(1, 1)] * 2, [(3,)] * 2, tables)
