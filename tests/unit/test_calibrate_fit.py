"""Calibration's fit recovers the speed and per-action overhead that produced two iterations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain.cluster import Cluster, Link
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Method
from pipetrain.profile.estimate import estimate_profile
from pipetrain.runtime.calibrate import Calibration, _simulated, calibration_plans, fit_terms, with_terms

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


def test_applied_terms_scale_every_device_and_set_the_overhead() -> None:
    slow = Cluster.local(2, speed=0.5)
    applied = Calibration(0.8, 3e-4, ("1f1b m=1", "zbv m=8"), (0.1, 0.2), (0.1, 0.2)).apply(slow)
    assert [d.speed for d in applied.devices] == [pytest.approx(0.4)] * 2 and applied.action_overhead_s == 3e-4
    assert with_terms(slow, 1.0, 0.0).devices == slow.devices
