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
