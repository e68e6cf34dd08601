"""Micro-batch planners: encoding, equal, greedy, DP, and the DGAP/TiDGAP genetic algorithm."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.microbatch import (
    PLANNER_NAMES,
    GAConfig,
    MicrobatchPlan,
    Partition,
    ask,
    best_equal,
    cap_cuts,
    cuts_to_partition,
    cuts_to_sizes,
    dgap,
    equal_seeds,
    ga,
    global_dp,
    init_state,
    local_greedy,
    plan_uedp,
    run_microbatch_planner,
    saturation_point,
    single_chromosome,
    sizes_to_cuts,
    tidgap,
)
from pipetrain.planners.microbatch.dp import stage_dp
from pipetrain.planners.microbatch.ga import one_f_one_b_ga
from pipetrain.planners.microbatch.ga_operators import _sync
from pipetrain.planners.microbatch.uedp import ALGORITHMS, PlannerName
from pipetrain.schedule.one_f_one_b import one_f_one_b_sequences
from pipetrain.simulate.chain import order_time
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import StageTables, iteration_times
from tests.conftest import flat_profile

SMALL = GAConfig(population=16, generations=12)


def toy_tables(seed: int, n_stages: int = 4, batch: int = 64) -> StageTables:
    """PAPERS.md §1.10: t_k(b) = α + β·max(b, s_k), s_k in [1, 32], own draw for g; c(b) = 0.05 + 0.01 b."""
    rng = np.random.default_rng(seed)
    b = np.arange(batch + 1)

    def table() -> npt.NDArray[np.float64]:
        alpha, beta = rng.uniform(0.1, 1.0, (n_stages, 1)), rng.uniform(0.01, 0.1, (n_stages, 1))
        t = alpha + beta * np.maximum(b, rng.integers(1, 33, (n_stages, 1)))
        t[:, 0] = 0.0
        return t

    link = np.tile(0.05 + 0.01 * b, (n_stages, 1))
    link[:, 0] = 0.0
    return StageTables(table(), table(), link, link)


def assert_valid(partition: Partition, n_stages: int, batch: int, caps: Sequence[int] | None = None) -> None:
    assert len(partition) == n_stages
    for k, sizes in enumerate(partition):
        assert sum(sizes) == batch and min(sizes) >= 1
        if caps is not None:
            assert max(sizes) <= caps[k]


def same_plan(a: MicrobatchPlan, b: MicrobatchPlan) -> bool:
    return (a.forward_sizes, a.backward_sizes, a.iteration_s, a.history_s) == (
        b.forward_sizes, b.backward_sizes, b.iteration_s, b.history_s)


# ---- encoding ---------------------------------------------------------------------------------


@given(st.lists(st.integers(1, 6), min_size=1, max_size=12))
def test_sizes_round_trip_through_cuts(sizes: list[int]) -> None:
    cuts = sizes_to_cuts(sizes, sum(sizes))
    assert cuts[-1] and cuts.sum() == len(sizes)
    assert cuts_to_sizes(cuts) == tuple(sizes)


@given(st.data())
@settings(max_examples=60)
def test_cap_cuts_adds_the_fewest_cuts(data: st.DataObject) -> None:
    n_stages, batch = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 20))
    caps = data.draw(st.lists(st.integers(1, 8), min_size=n_stages, max_size=n_stages))
    cuts = np.array(data.draw(st.lists(st.booleans(), min_size=n_stages * batch, max_size=n_stages * batch)))
    cuts = cuts.reshape(n_stages, batch)
    cuts[:, -1] = True
    capped = cap_cuts(cuts, caps)
    assert np.all(capped >= cuts)  # only adds cuts
    for k, (before, after) in enumerate(zip(cuts_to_partition(cuts), cuts_to_partition(capped), strict=True)):
        assert max(after) <= caps[k]
        assert len(after) == sum(-(-x // caps[k]) for x in before)  # each piece split into ceil(x / cap)


def test_equal_seeds_are_gpipe_partitions() -> None:
    seeds = equal_seeds(3, 10)
    assert seeds.shape == (10, 3, 10)
    for m in range(1, 11):
        assert cuts_to_partition(seeds[m - 1]) == (equal_sizes(10, m),) * 3


# ---- equal, greedy, dp ------------------------------------------------------------------------


def test_best_equal_is_the_fastest_equal_count() -> None:
    tables = toy_tables(0, 3, 24)
    brute = min((iteration_time([equal_sizes(24, m)] * 3, [equal_sizes(24, m)] * 3, tables), m) for m in range(1, 25))
    result = best_equal(tables)
    assert result.iteration_s == brute[0]
    assert result.forward_sizes == result.backward_sizes == (equal_sizes(24, brute[1]),) * 3


def test_best_equal_respects_caps() -> None:
    result = best_equal(toy_tables(1, 3, 24), caps=[24, 5, 24])
    assert max(result.forward_sizes[0]) <= 5


def test_saturation_point() -> None:
    b = np.arange(33.0)
    assert saturation_point(np.where(b > 0, 0.3 + 0.1 * np.maximum(b, 12), 0.0)) == 12
    assert saturation_point(0.5 * b) == 1
    assert saturation_point(np.where(b > 0, 1.0, 0.0)) == 32


@pytest.mark.parametrize("seed", range(6))
def test_greedy_and_dp_give_valid_partitions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, batch = int(rng.integers(1, 6)), int(rng.integers(1, 40))
    tables = toy_tables(seed, n, batch)
    caps = [int(c) for c in rng.integers(1, batch + 1, n)]
    for result in (local_greedy(tables), local_greedy(tables, bounded=False), global_dp(tables),
                   local_greedy(tables, caps), global_dp(tables, caps)):
        assert_valid(result.forward_sizes, n, batch)
        assert_valid(result.backward_sizes, n, batch)
        assert result.iteration_s == iteration_time(result.forward_sizes, result.backward_sizes, tables)
    for result in (local_greedy(tables, caps), global_dp(tables, caps)):
        assert_valid(result.forward_sizes, n, batch, caps)
        assert_valid(result.backward_sizes, n, batch, caps)


def test_greedy_picks_the_saturation_size() -> None:
    b = np.arange(17.0)
    f = np.where(b > 0, 1.0 + 0.5 * np.maximum(b, 4), 0.0)
    zero = np.zeros((1, 17))
    result = local_greedy(StageTables(f[None], 2 * f[None], zero, zero))
    assert result.forward_sizes == ((4, 4, 4, 4),)
    assert local_greedy(StageTables(f[None], 2 * f[None], zero, zero), bounded=False).forward_sizes == ((16,),)


def test_stage_dp_is_optimal_for_its_own_finish() -> None:
    """Against every composition of 10 samples, with staggered arrivals and a random cost table."""
    rng = np.random.default_rng(3)
    batch = 10
    for _ in range(5):
        arrival = np.concatenate([[0.0], np.sort(rng.uniform(0, 3, batch))])
        table = np.concatenate([[0.0], rng.uniform(0.2, 1.5, batch)])
        best = float("inf")
        for mask in range(1 << (batch - 1)):
            cuts = np.array([bool(mask >> i & 1) for i in range(batch - 1)] + [True])
            end, lo = 0.5, 0
            for x in cuts_to_sizes(cuts):
                end = max(end, arrival[lo + x]) + table[x]
                lo += x
            best = min(best, end)
        sizes, done = stage_dp(arrival, table, 0.5, batch)
        assert sum(sizes) == batch and float(done[-1]) == pytest.approx(best, rel=1e-12)


# ---- the GA -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["dual", "single"])
@pytest.mark.parametrize("seed", range(5))
def test_ga_is_never_worse_than_the_best_equal_plan(mode: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, batch = int(rng.integers(1, 5)), int(rng.integers(1, 30))
    tables = toy_tables(seed, n, batch)
    result = ga(tables, seed=seed, config=SMALL, mode="dual" if mode == "dual" else "single")
    assert result.iteration_s <= best_equal(tables).iteration_s
    assert_valid(result.forward_sizes, n, batch)
    assert result.iteration_s == iteration_time(result.forward_sizes, result.backward_sizes, tables)
    if mode == "single":
        assert result.forward_sizes == result.backward_sizes


def test_same_seed_same_plan() -> None:
    tables = toy_tables(7, 3, 32)
    assert same_plan(tidgap(tables, seed=5, config=SMALL), tidgap(tables, seed=5, config=SMALL))


def test_tidgap_and_dgap_follow_the_same_search() -> None:
    """Bit-identical evaluators and one RNG stream: the same plan and the same history."""
    for seed in range(3):
        tables = toy_tables(seed, 3, 24)
        fast, slow = tidgap(tables, seed=seed, config=SMALL), dgap(tables, seed=seed, config=SMALL)
        assert same_plan(fast, slow)
        assert (fast.planner, slow.planner) == ("tidgap", "dgap")


@pytest.mark.parametrize("planner", ["tidgap", "single"])
def test_ga_respects_memory_caps(planner: str) -> None:
    tables = toy_tables(4, 4, 32)
    caps = [3, 32, 7, 1]
    result = (tidgap if planner == "tidgap" else single_chromosome)(tables, seed=1, config=SMALL, caps=caps)
    assert_valid(result.forward_sizes, 4, 32, caps)
    assert_valid(result.backward_sizes, 4, 32, caps)
    assert result.iteration_s <= best_equal(tables, caps).iteration_s


def test_history_and_progress_callback() -> None:
    seen: list[tuple[int, float]] = []
    result = tidgap(toy_tables(2, 2, 16), seed=0, config=SMALL, on_generation=lambda g, t: seen.append((g, t)))
    assert [g for g, _ in seen] == list(range(1, SMALL.generations + 1))
    assert tuple(t for _, t in seen) == result.history_s
    assert all(a >= b for a, b in zip(result.history_s, result.history_s[1:], strict=False))
    assert result.history_s[-1] == result.iteration_s


def test_state_is_immutable_and_ask_is_reproducible() -> None:
    tables = toy_tables(6, 3, 16)

    def evaluate(f: npt.NDArray[np.bool_], b: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        return iteration_times(f, b, tables)

    state = init_state(tables, SMALL, np.random.default_rng(0), evaluate)
    assert not state.forward.flags.writeable and not state.times_s.flags.writeable
    before = state.forward.copy()
    first = ask(state, SMALL, np.random.default_rng(1))
    second = ask(state, SMALL, np.random.default_rng(1))
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert np.array_equal(state.forward, before)
    assert first[0].shape == (SMALL.population - SMALL.elite, 3, 16)


def test_dual_beats_single_on_the_toy_check() -> None:
    """PAPERS.md §1.10 instances (K = 4, B = 64), shortened to P = 64, G = 150: dual <= single <= equal."""
    config = GAConfig(population=64, generations=150)
    gains = []
    for instance in range(5):
        tables = toy_tables(100 + instance)
        equal = best_equal(tables).iteration_s
        single = single_chromosome(tables, seed=0, config=config).iteration_s
        dual = tidgap(tables, seed=0, config=config).iteration_s
        assert dual <= single <= equal
        gains.append(equal / dual - 1)
    assert max(gains) > 0.01  # the dual chromosome finds a real improvement somewhere


def test_sync_copies_rows_between_the_chromosomes() -> None:
    rng = np.random.default_rng(0)
    forward, backward = rng.random((20, 3, 16)) < 0.3, rng.random((20, 3, 16)) < 0.3
    before = forward | backward
    _sync(forward, backward, 1.0, rng)
    assert np.array_equal(forward, backward)  # every stage synced, one way or the other
    assert np.all(forward <= before)  # each synced row is one of the two rows it had
    untouched_f, untouched_b = forward.copy(), backward.copy()
    _sync(untouched_f, untouched_b, 0.0, rng)
    assert np.array_equal(untouched_f, forward) and np.array_equal(untouched_b, backward)


def test_coupled_phase_keeps_backward_equal_to_forward() -> None:
    """With every generation coupled, children have backward = forward, so only the random half of
    generation 0 can differ, and an all-coupled population stays coupled."""
    tables = toy_tables(7, 3, 16)
    coupled = GAConfig(population=16, generations=12, coupled_fraction=1.0)
    state = init_state(tables, coupled, np.random.default_rng(0), lambda f, b: iteration_times(f, b, tables))
    forward, backward = ask(state, coupled, np.random.default_rng(1), mode="single")
    assert np.array_equal(forward, backward)
    assert not np.array_equal(state.forward, state.backward)  # the dual random half
    result = tidgap(tables, seed=0, config=coupled)
    assert result.iteration_s <= best_equal(tables).iteration_s


@pytest.mark.parametrize("seed", range(4))
def test_one_f_one_b_ga_is_never_worse_than_the_best_equal_1f1b_plan(seed: int) -> None:
    """Seeded with the equal plans, timed under their 1F1B orders: per-stage sizes, forward = backward."""
    rng = np.random.default_rng(seed)
    n, batch = int(rng.integers(1, 5)), int(rng.integers(1, 30))
    tables = toy_tables(seed, n, batch)
    result = one_f_one_b_ga(tables, seed=seed, config=SMALL)
    equal_1f1b = min(order_time(one_f_one_b_sequences([sizes] * n), [sizes] * n, [sizes] * n, tables)
                     for sizes in (equal_sizes(batch, m) for m in range(1, batch + 1)))
    assert result.iteration_s <= equal_1f1b
    assert result.forward_sizes == result.backward_sizes and result.planner == "1f1b-ga"
    fwd = result.forward_sizes
    assert result.iteration_s == order_time(one_f_one_b_sequences(fwd), fwd, fwd, tables)
    assert same_plan(result, one_f_one_b_ga(tables, seed=seed, config=SMALL))
    with pytest.raises(ValueError, match="mode='single'"):
        ga(tables, evaluator="1f1b", mode="dual")


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="elite"):
        GAConfig(population=2, elite=2)
    with pytest.raises(ValueError, match="probability"):
        GAConfig(row_swap_p=1.5)
    with pytest.raises(ValueError, match="caps"):
        tidgap(toy_tables(0, 2, 8), config=SMALL, caps=[1])


# ---- plans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_plan_uedp_builds_a_simulated_uedp_plan(planner: PlannerName) -> None:
    profile = flat_profile(3, [0.2, 0.4, 0.3], [0.5, 0.6, 0.4], per_sample=True, output_bytes=1000)
    cost = CostModel(profile, Cluster.local(3, link=Link(0.05, 1e5), action_overhead_s=0.1))
    sizes = equal_sizes(12, 3)
    method = Method.INTERLEAVED if planner == "interleaved-ga" else Method.GPIPE  # v = 1: a looping placement
    base = Plan("synthetic", "", 12, method, tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(3)))
    plan = plan_uedp(base, cost, planner=planner, seed=0, config=SMALL)
    plan.validate()
    assert plan.method is ALGORITHMS[planner].method
    assert [s.layers for s in plan.stages] == [s.layers for s in base.stages]
    tables = StageTables.from_plan(plan, cost)
    predicted = run_microbatch_planner(planner, tables, seed=0, config=SMALL, n_ranks=plan.n_ranks)
    assert plan.prediction is not None
    assert plan.prediction.iteration_s == pytest.approx(predicted.iteration_s, rel=1e-9)
    assert tuple(s.forward_sizes for s in plan.stages) == predicted.forward_sizes


@pytest.mark.parametrize(("caps", "forward", "backward", "seconds"), [
    (None, ((20, 12), (16, 16), (16, 16)), ((32,), (16, 16), (16, 16)), 13.817219146030181),
    ([5, 32, 7], ((5, 5, 5, 5, 4, 4, 4), (5, 3, 2, 5, 5, 4, 4, 4), (7, 7, 6, 6, 6)),
     ((5, 5, 5, 5, 4, 4, 4), (5, 5, 5, 5, 4, 4, 4), (7, 7, 6, 6, 6)), 30.25940505548387),
])
def test_tidgap_plans_are_pinned(caps: list[int] | None, forward: Partition, backward: Partition,
                                 seconds: float) -> None:
    """The plans TiDGAP found before issue 17's speed-ups (commit 04843fb): operators, seeding and
    evaluator may get faster, never different."""
    result = tidgap(toy_tables(7, 3, 32), seed=5, config=GAConfig(population=24, generations=30), caps=caps)
    assert (result.forward_sizes, result.backward_sizes, result.iteration_s) == (forward, backward, seconds)
