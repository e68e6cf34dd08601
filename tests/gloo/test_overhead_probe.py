"""The overhead probe fits the runtime's seconds per action from a real 2-rank run of a tiny model."""

from __future__ import annotations

import math

import pytest

from pipetrain.calibrate.overhead import _tiny_plan, probe_action_overhead
from pipetrain.cluster import Link

LINK = Link(60e-6, 3e9)


@pytest.mark.slow
def test_the_fitted_overhead_reproduces_the_measured_step() -> None:
    probe = probe_action_overhead(LINK, micro=8, steps=4, runs=1)
    assert probe.overhead_s > 0 and math.isfinite(probe.overhead_s)  # a real runtime is never free
    assert probe.overhead_s < 0.05  # generous: a loaded 2-core machine measured 1-2 ms
    # 1F1B on 2 stages, 8 micro-batches: the critical path holds every action of one stage and a few more
    assert 2 * 8 <= probe.actions <= 4 * 8
    assert probe.fitted_s == pytest.approx(probe.measured_s[0], rel=1e-6)  # the simulator's step, refitted


def test_the_probe_model_is_tiny() -> None:
    """Each action's kernels take microseconds, so the step is almost only overhead and messages."""
    _, plan, profile = _tiny_plan(2, 16, LINK)
    assert plan.n_ranks == 2 and len(plan.stages[0].forward_sizes) == 16
    assert max(lp.forward_at(1) + lp.backward_at(1) for lp in profile.layers) < 1e-3


def test_the_messages_host_seconds_are_not_counted_as_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the ranks' host seconds per message in the simulation, less of a measured step is left
    for the per-action overhead, and the simulated step with both still matches the measured one."""
    from types import SimpleNamespace

    from pipetrain.calibrate import overhead
    from pipetrain.cluster import MessageHost

    monkeypatch.setattr(overhead, "train_many", lambda jobs: [SimpleNamespace(samples_per_s=8 / 0.02)] * len(jobs))
    plain = probe_action_overhead(LINK, micro=8, runs=1)
    hosted = probe_action_overhead(LINK, micro=8, runs=1, message_host=MessageHost(send_s=1e-4, recv_s=1e-4))
    assert hosted.base_s > plain.base_s and 0 < hosted.overhead_s < plain.overhead_s
    assert hosted.fitted_s == pytest.approx(0.02, rel=1e-6) == plain.fitted_s


def test_a_probe_under_load_warns_that_its_cost_per_action_is_inflated(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import os
    from types import SimpleNamespace

    from pipetrain.calibrate import overhead
    from pipetrain.cluster import Cluster

    monkeypatch.setattr(overhead, "probe_cluster", lambda n, **_: Cluster.local(n))
    monkeypatch.setattr(overhead, "probe_action_overhead", lambda *_, **__: SimpleNamespace(overhead_s=5e-3))
    cores = os.cpu_count() or 1
    for load, warned in ((cores + 13.0, True), (cores * 0.5, False)):
        monkeypatch.setattr(overhead, "load_average", lambda load=load: load)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pipetrain.calibrate.overhead"):
            assert overhead.probe_local_cluster(2).action_overhead_s == 5e-3
        assert ("will overprice plans of many actions" in caplog.text) is warned
