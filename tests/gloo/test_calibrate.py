"""Calibration on the model's own work: three real 2-rank runs of a small model (two pipelines, one
data-parallel), and the fitted terms reproduce their measured iterations."""

from __future__ import annotations

import math

import pytest

from pipetrain.calibrate.fit import calibrate_cluster
from pipetrain.cluster import Cluster, Link
from pipetrain.graph.zoo import build_model
from pipetrain.profile.measure import measure_profile


@pytest.mark.slow
def test_the_fitted_terms_reproduce_both_runs() -> None:
    graph = build_model("mlp", n_layers=4, inputs=32, width=128, hidden=128, classes=8)
    profile = measure_profile(graph, 16, progress=False)
    cluster = Cluster.local(2, link=Link(60e-6, 3e9), action_overhead_s=1e-4)
    calibration = calibrate_cluster(graph, profile, cluster, 16, steps=4, runs=1, run_s=0.0)  # 4 steps a run
    assert calibration.settings == ("1f1b m=1", "zbv m=8", "replicated ×2")
    assert 0.2 <= calibration.speed <= 5.0 and math.isfinite(calibration.overhead_s)
    assert calibration.overhead_s < 0.05  # generous: a loaded 2-core machine measured 0.1-2 ms per action
    if calibration.overhead_s > 0 and 0.2 < calibration.speed < 5.0:  # not held at a bound: solved exactly
        for measured, fitted in zip(calibration.measured_s[:2], calibration.predicted_s[:2], strict=True):
            assert fitted == pytest.approx(measured, rel=0.02)
    assert calibration.collective is not None
    held = calibration.collective.latency_s <= 0 or calibration.collective.bandwidth_bytes_per_s >= 1e14
    if not held:  # the fitted term (latency or seconds per byte) not held at 0: the data-parallel run is reproduced
        assert calibration.predicted_s[2] == pytest.approx(calibration.measured_s[2], rel=0.02)
    applied = calibration.apply(cluster)
    assert applied.devices[0].speed == pytest.approx(calibration.speed)
    assert "µs per action" in calibration.describe()
