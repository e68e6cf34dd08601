"""A rank that raises or is killed mid-step stops the whole pipeline, fast and named (DESIGN.md §5.5).

``train`` must raise :class:`PipelineFailure` naming the failed stage and rank well within the
timeout, and leave no rank process behind.
"""

from __future__ import annotations

import time

import pytest

from pipetrain.errors import PipelineFailure
from pipetrain.runtime import FaultInjection, TrainConfig, train

from .models import chain_plan, mlp_graph, rank_processes

TIMEOUT_S = 120.0
"""The runtime's timeout: a failure must be named well before it. Long, so that a slow start of the ranks on
a loaded machine (45 s at a load of 15 on 2 cores) is never mistaken for waiting out the timeout."""

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S + 60)


def _fail(n_stages: int, fault: FaultInjection) -> tuple[PipelineFailure, float]:
    graph = mlp_graph()
    config = TrainConfig(steps=4, progress=False, timeout_s=TIMEOUT_S, fault=fault)
    before = set(rank_processes())
    start = time.monotonic()
    with pytest.raises(PipelineFailure) as info:
        train(graph, chain_plan(graph, n_stages, 12, 3), config)
    elapsed = time.monotonic() - start
    assert set(rank_processes()) <= before, "rank processes outlived train()"
    return info.value, elapsed


def test_raising_rank_is_named() -> None:
    error, elapsed = _fail(2, FaultInjection(rank=1, step=2, kind="raise"))
    message = str(error)
    assert message.startswith("stage 1 (rank 1) failed at step 2: InjectedFault: injected fault before ")
    assert elapsed < TIMEOUT_S  # named, not timed out (start-up of the ranks included)
    assert any("Traceback" in note for note in getattr(error, "__notes__", []))


@pytest.mark.slow
def test_killed_middle_rank_is_named() -> None:
    error, elapsed = _fail(3, FaultInjection(rank=1, step=1, kind="kill"))
    assert str(error) == "stage 1 (rank 1) died (exit code -9 / signal SIGKILL)"
    assert elapsed < TIMEOUT_S


@pytest.mark.slow
def test_first_stage_raising_at_step_0() -> None:
    error, _ = _fail(2, FaultInjection(rank=0, step=0, kind="raise"))
    assert str(error).startswith("stage 0 (rank 0) failed at step 0: InjectedFault")
