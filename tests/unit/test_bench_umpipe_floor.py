"""UMPIPE's simulated benchmark: the floor under every plan (benchmarks/common/umpipe_floor.py) and the
ceilings its report draws from it (benchmarks/common/umpipe_report.py)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common.umpipe_floor import cheapest_partition_s, flush_floor_s
from common.umpipe_report import umpipe_report

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.microbatch import GAConfig, plan_uedp
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

SIZES = (1, 2, 4, 8, 16)
BATCH = 16
# (fixed, per sample) seconds of forward; backward costs twice both. The last layer, like a head
# with its loss, is the slowest and pays the most per micro-batch.
LAYERS = ((0.1, 0.2), (0.1, 0.2), (0.1, 0.3), (0.5, 0.6))


def _cost(n_devices: int) -> CostModel:
    layers = tuple(LayerProfile(f"l{i}", SIZES, tuple(a + c * b for b in SIZES), tuple(2 * (a + c * b) for b in SIZES),
                                100, 0, 0, 0.0, 0.0) for i, (a, c) in enumerate(LAYERS))
    return CostModel(Profile("toy", "", "cpu", "affine", 100, layers), Cluster.local(n_devices, link=Link(0.01, 1e6)))


def _simulated(cost: CostModel, counts: tuple[int, ...], n_micro: int, method: Method = Method.GPIPE) -> Plan:
    sizes, start, stages = equal_sizes(BATCH, n_micro), 0, []
    for rank, count in enumerate(counts):
        stages.append(StagePlan(tuple(f"l{i}" for i in range(start, start + count)), (rank,), sizes, sizes))
        start += count
    return Plan("toy", "", BATCH, method, tuple(stages))


def _time(plan: Plan, cost: CostModel) -> float:
    return simulate(build_schedule(plan), plan, cost).iteration_s


def test_cheapest_partition_is_one_micro_batch_under_fixed_costs_and_single_samples_when_convex() -> None:
    assert cheapest_partition_s(lambda b: 1.0 + b, 8) == pytest.approx(9.0)
    assert cheapest_partition_s(lambda b: float(b * b), 8) == pytest.approx(8.0)
    # 3 + 2·b up to 4 samples, 25 beyond: two micro-batches of 4 (2 · 11) beat one of 8 (25) and 8 of 1 (40)
    assert cheapest_partition_s(lambda b: 3.0 + 2 * b if b <= 4 else 25.0, 8) == pytest.approx(22.0)


def test_one_layer_per_device_the_floor_is_the_slowest_layers_work_between_one_samples_fill_and_drain() -> None:
    cost = _cost(4)
    fill = (0.1 + 0.2) + (0.1 + 0.2) + (0.1 + 0.3)  # the first sample's forward through l0..l2
    work = 3 * (0.5 + 0.6 * BATCH)  # l3's forward and backward, one micro-batch (fixed costs: fewest is cheapest)
    assert flush_floor_s(cost, ["l0", "l1", "l2", "l3"], BATCH, 4) == pytest.approx(fill + work + 2 * fill)


def test_on_one_device_the_floor_is_the_whole_models_work_in_one_micro_batch_which_the_simulator_agrees_with() -> None:
    cost = _cost(1)
    floor = flush_floor_s(cost, ["l0", "l1", "l2", "l3"], BATCH, 1)
    assert floor == pytest.approx(sum(3 * (a + c * BATCH) for a, c in LAYERS))
    assert _time(_simulated(cost, (4,), 1), cost) == pytest.approx(floor)


@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_no_plan_of_any_cuts_or_micro_batching_beats_the_floor(n_stages: int) -> None:
    cost = _cost(n_stages)
    floor = flush_floor_s(cost, ["l0", "l1", "l2", "l3"], BATCH, n_stages)
    every_cut = [c for c in itertools.product(range(1, 4), repeat=n_stages) if sum(c) == len(LAYERS)]
    times = [_time(_simulated(cost, counts, m, method), cost) for counts in every_cut
             for m in (1, 2, 4, 8, 16) for method in (Method.GPIPE, Method.ONE_F_ONE_B)]
    config = GAConfig(population=16, generations=10)
    times += [_time(plan_uedp(_simulated(cost, counts, 4), cost, planner="tidgap", seed=0, config=config), cost)
              for counts in every_cut]
    assert min(times) >= floor * (1 - 1e-9)
    assert min(times) < 1.35 * floor  # no trivial bound: the bubbles it leaves out cost 25–31% here


def _row(cluster: str, gpipe_4k: float, floor: float | None) -> dict[str, object]:
    planners = ("greedy", "dp", "tidgap", "tidgap-cuts", "single", "tidgap-free", "tidgap-free (planned)", "1f1b-ga")
    times = {"gpipe": 1.0, "1f1b": 1.0, "gpipe@4K": gpipe_4k, "1f1b@4K": gpipe_4k} | dict.fromkeys(planners, 0.98)
    row: dict[str, object] = {"network": "gpt1-14", "cluster": cluster, "n_stages": 4, "batch": 64, "times_s": times,
                              "search_s": dict.fromkeys(planners, 1.0), "cuts": {"base": [4], "tidgap-cuts": [4]}}
    return row if floor is None else row | {"floor_s": floor}


def test_the_report_puts_the_ceiling_beside_the_gain_and_leaves_it_out_for_rows_without_a_floor() -> None:
    report = umpipe_report([_row("4xV100", 1.1, 0.9), _row("8xV100", 1.05, 1.0)], "a test")
    ceiling = next(h for h in report.headlines if "ceiling" in h.label)
    assert ceiling.value == pytest.approx((1.1 / 0.9 + 1.05) / 2)
    assert "## (5) Ceilings" in report.markdown and "| gpt1-14 | 1.222× / 1.111× | 1.050× / 1.000× |" in report.markdown
    old = umpipe_report([_row("4xV100", 1.1, None)], "a test")
    assert not any("ceiling" in h.label for h in old.headlines) and "(5) Ceilings" not in old.markdown
