"""Calibration's fit recovers the speed and per-action overhead that produced two iterations."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain import api
from pipetrain.calibrate.fit import (
    Calibration,
    _simulated,
    calibration_plans,
    fit_collective,
    fit_terms,
    replicated_plan,
    with_terms,
)
from pipetrain.cluster import Cluster, Link
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.profile.estimate import estimate_profile

CLUSTER = Cluster.local(2, link=Link(50e-6, 4e9), action_overhead_s=1e-4, shared_speed=(1.0, 0.9))
GRAPH = build_model("mlp", n_layers=8, inputs=64, width=256, hidden=256, classes=10)
PROFILE = estimate_profile(GRAPH, "cpu", 64)


def test_the_plans_are_few_and_many_actions() -> None:
    few, many = calibration_plans(GRAPH, PROFILE, CLUSTER, 64)
    assert (few.method, len(few.stages), len(few.stages[0].forward_sizes)) == (Method.ONE_F_ONE_B, 2, 1)
    assert (many.method, len(many.stages), len(many.stages[0].forward_sizes)) == (Method.ZBV, 4, 8)


def test_a_model_too_short_for_a_v_calibrates_with_zb1_and_one_shorter_than_the_ranks_is_refused() -> None:
    three = build_model("mlp", n_layers=3, inputs=16, width=32, hidden=32, classes=4)
    _, many = calibration_plans(three, estimate_profile(three, "cpu", 8), CLUSTER, 8)
    assert many.method == Method.ZB1 and len(many.stages[0].forward_sizes) == 8
    with pytest.raises(UserError, match="one stage per rank"):
        calibration_plans(three, estimate_profile(three, "cpu", 8), Cluster.local(4), 8)


@settings(max_examples=15, deadline=None)
@given(speed=st.floats(0.5, 1.5), overhead=st.floats(0.0, 2e-3))
def test_fit_recovers_the_terms_that_produced_the_iterations(speed: float, overhead: float) -> None:
    plans = calibration_plans(GRAPH, PROFILE, CLUSTER, 64)
    measured = _simulated(plans, PROFILE, CLUSTER, 1.0 / speed, overhead)
    got_speed, got_overhead = fit_terms(plans, PROFILE, CLUSTER, list(measured))
    assert got_speed == pytest.approx(speed, rel=0.02)
    assert got_overhead == pytest.approx(overhead, rel=0.05, abs=2e-6)


def test_the_runs_step_the_users_optimizer_and_the_simulations_price_it() -> None:
    """Calibrating for adamw: every plan steps adamw, and its simulated iteration is adamw's (dearer
    than sgd's), so the terms fitted to adamw runs do not absorb the optimizer's step."""
    plans = [*calibration_plans(GRAPH, PROFILE, CLUSTER, 64, "adamw"), replicated_plan(GRAPH, CLUSTER, 64, "adamw")]
    assert {p.optimizer for p in plans} == {"adamw"}
    plain = [replace(p, optimizer="sgd") for p in plans]
    assert (_simulated(plans, PROFILE, CLUSTER, 1.0, 0.0) > _simulated(plain, PROFILE, CLUSTER, 1.0, 0.0)).all()


def test_runs_that_ask_for_a_negative_overhead_get_none_and_the_speed_that_splits_the_miss() -> None:
    """The second run faster than any overhead ≥ 0 explains: no overhead, and a speed that misses both
    runs by relative errors of opposite signs, not one run exactly and the other by all the rest."""
    plans = calibration_plans(GRAPH, PROFILE, CLUSTER, 64)
    truth = _simulated(plans, PROFILE, CLUSTER, 1.0, 0.0)
    measured = [truth[0], truth[1] * 0.7]
    speed, overhead = fit_terms(plans, PROFILE, CLUSTER, measured)
    fitted = _simulated(plans, PROFILE, CLUSTER, 1.0 / speed, 0.0)
    errors = [f / m - 1 for f, m in zip(fitted, measured, strict=True)]
    assert overhead == 0.0 and errors[0] < 0 < errors[1] and max(map(abs, errors)) < 0.3


def test_applied_terms_scale_every_device_and_set_the_overhead() -> None:
    slow = Cluster.local(2, speed=0.5)
    applied = Calibration(0.8, 3e-4, ("1f1b m=1", "zbv m=8"), (0.1, 0.2), (0.1, 0.2)).apply(slow)
    assert [d.speed for d in applied.devices] == [pytest.approx(0.4)] * 2 and applied.action_overhead_s == 3e-4
    assert with_terms(slow, 1.0, 0.0).devices == slow.devices


def test_the_replicated_plan_puts_every_layer_on_every_rank_one_micro_batch_each() -> None:
    plan = replicated_plan(GRAPH, CLUSTER, 63)
    (stage,) = plan.stages
    assert stage.ranks == (0, 1) and len(stage.layers) == len(GRAPH) and stage.forward_sizes == (32, 31)
    with pytest.raises(UserError, match="too small"):
        replicated_plan(GRAPH, Cluster.local(4), 3)


SMALL = build_model("mlp", n_layers=4, inputs=8, width=16, hidden=16, classes=4)  # ~1 KB of weights a layer
SMALL_PROFILE = estimate_profile(SMALL, "cpu", 64)


@settings(max_examples=10, deadline=None)
@given(latency=st.floats(0.0, 5e-3))
def test_small_gradients_fit_the_all_reduce_latency(latency: float) -> None:
    cluster = Cluster.local(2, link=Link(50e-6, 4e9), collective=Link(1e-4, 1e9))
    plan = replicated_plan(SMALL, cluster, 64)
    truth = replace(cluster, collective=Link(latency, 1e9))
    measured = api.predict(plan, SMALL_PROFILE, truth)[1].iteration_s
    fitted = fit_collective(plan, SMALL_PROFILE, cluster, measured)
    assert fitted.latency_s == pytest.approx(latency, abs=1e-7) and fitted.bandwidth_bytes_per_s == 1e9


@settings(max_examples=10, deadline=None)
@given(bandwidth=st.floats(2e8, 5e9))
def test_large_gradients_fit_the_all_reduce_bandwidth(bandwidth: float) -> None:
    cluster = Cluster.local(2, link=Link(50e-6, 4e9), collective=Link(1e-5, 1e9))
    plan = replicated_plan(GRAPH, cluster, 64)  # 2 MB of gradients: bytes dominate
    truth = replace(cluster, collective=Link(1e-5, bandwidth))
    measured = api.predict(plan, PROFILE, truth)[1].iteration_s
    fitted = fit_collective(plan, PROFILE, cluster, measured)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-3) and fitted.latency_s == 1e-5


def test_fit_collective_starts_from_the_link_without_a_probed_all_reduce_and_stops_at_zero() -> None:
    no_collective = Cluster.local(2, link=Link(50e-6, 4e9))
    plan = replicated_plan(SMALL, no_collective, 64)
    fitted = fit_collective(plan, SMALL_PROFILE, no_collective, 0.0)  # faster than any all-reduce allows
    assert fitted == Link(0.0, 4e9)


def test_a_fitted_collective_is_applied_and_described() -> None:
    calibration = Calibration(1.0, 1e-4, ("1f1b m=1", "zbv m=8", "replicated ×2"), (0.1, 0.2, 0.05),
                              (0.1, 0.2, 0.05), Link(1.4e-3, 1e9))
    assert calibration.apply(CLUSTER).collective == Link(1.4e-3, 1e9)
    assert "all-reduce 1400 µs + bytes at 1.00 GB/s" in calibration.describe()
