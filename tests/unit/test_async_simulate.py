"""Asynchronous methods in the simulator, the memory model and the CLI (docs/algorithms.md §3.5)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.segments import segmented_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import stage_memory
from pipetrain.simulate.steady import steady_state
from tests.conftest import flat_profile
from tests.unit.test_cli import run, tiny_profile

__all__ = ["tiny_profile"]  # the CLI test's fixture, used here

FREE = Link(0.0, 1e30)


def chain(n_stages: int, n_micro: int, method: Method = Method.ONE_F_ONE_B, replicas: tuple[int, ...] = ()) -> Plan:
    sizes, stages, first = equal_sizes(16, n_micro), [], 0
    for k, r in enumerate(replicas or (1,) * n_stages):
        stages.append(StagePlan((f"l{k}",), tuple(range(first, first + r)), sizes, sizes))
        first += r
    return Plan("synthetic", "", 16, Method.ONE_F_ONE_B, tuple(stages)).run_by(method)


@pytest.mark.parametrize("method", [Method.PIPEDREAM, Method.TWO_BW])
@pytest.mark.parametrize(("n_stages", "n_micro"), [(2, 4), (4, 4), (4, 8)])
def test_steady_state_closed_form(method: Method, n_stages: int, n_micro: int) -> None:
    """Uniform stages, free links, no flush: N batches take (N·m + K − 1)(f + b), so a batch costs
    m(f + b) in the steady state and filling plus draining the pipeline (K − 1)(f + b) once."""
    cost = CostModel(flat_profile(n_stages, 1.0, 2.0), Cluster.local(n_stages, link=FREE))
    steady = steady_state(chain(n_stages, n_micro, method), cost)
    assert steady.batch_s == pytest.approx(n_micro * 3.0)
    assert steady.warmup_s == pytest.approx((n_stages - 1) * 3.0)
    assert steady.samples_per_s == pytest.approx(16 / (n_micro * 3.0))
    sync = steady_state(chain(n_stages, n_micro), cost)
    assert sync.warmup_s == 0 and sync.batch_s == pytest.approx((n_micro + n_stages - 1) * 3.0)


@pytest.mark.parametrize("method", [Method.PIPEDREAM, Method.TWO_BW])
@pytest.mark.parametrize("every", [1, 2, 5])
def test_drains_cost_a_fill_and_drain_per_segment(method: Method, every: int) -> None:
    """A run checkpointing every c batches drains its pipeline there: the simulator runs two segments
    of c batches in 2·(c·m + K − 1)(f + b), which the drained samples/s predicts."""
    plan = chain(4, 4, method)
    cost = CostModel(flat_profile(4, 1.0, 2.0), Cluster.local(4, link=FREE))
    timeline = simulate(segmented_schedule(plan, 2 * every, (every,)), plan, cost)
    assert timeline.iteration_s == pytest.approx(2 * (every * 4 + 3) * 3.0)
    steady = steady_state(plan, cost)
    assert steady.drained_samples_per_s(every) == pytest.approx(2 * every * 16 / timeline.iteration_s)
    assert steady.drained_samples_per_s(every) < steady.samples_per_s == steady.drained_samples_per_s(0)


def test_replicated_stage_steps_in_pairs() -> None:
    """The replicas of stage 0 finish their i-th STEPs together (each STEP's event starts when its
    replica reached it: the wait for the other is inside, as in the runtime); the run finishes (no
    deadlock) and the Gantt has several batches' actions."""
    plan = chain(3, 4, Method.PIPEDREAM, replicas=(2, 1, 1))
    cost = CostModel(flat_profile(3, 1.0, 2.0, step_s=0.5), Cluster.local(4, link=FREE))
    timeline = simulate(build_schedule(plan, 3), plan, cost)
    steps = [[e for e in timeline.events if e.rank == r and e.action.kind.value == "STEP"] for r in (0, 1)]
    assert len(steps[0]) == len(steps[1]) == 6
    assert [e.end_s for e in steps[0]] == pytest.approx([e.end_s for e in steps[1]])
    assert max(e.action.hi for e in timeline.events) == 3 * 16


@pytest.mark.parametrize(("method", "weights", "versions"), [
    (Method.PIPEDREAM, WeightPolicy.STASH, [4, 3, 2, 1]),
    (Method.PIPEDREAM, WeightPolicy.VERTICAL_SYNC, [4, 4, 4, 4]),
    (Method.TWO_BW, WeightPolicy.TWO_BW, [2, 2, 2, 2]),
    (Method.ONE_F_ONE_B, WeightPolicy.SYNC, [1, 1, 1, 1]),
])
def test_memory_counts_weight_versions(method: Method, weights: WeightPolicy, versions: list[int]) -> None:
    """Weights: versions × parameter bytes (stashing: the in-flight count K − k); one gradient and
    optimizer state; activations of the micro-batches in flight."""
    plan = chain(4, 8, method, ())
    plan = replace(plan, weights=weights)
    cost = CostModel(flat_profile(4, 1.0, 2.0, parameter_bytes=1000, saved_bytes=10),
                     Cluster.local(4, link=FREE))
    memories = stage_memory(plan, cost, optimizer="adam")
    assert [m.weight_bytes // 1000 for m in memories] == versions
    assert all(m.gradient_bytes == 1000 and m.optimizer_state_bytes == 2000 for m in memories)
    assert [m.activation_bytes // (10 * 2) for m in memories] == [4, 3, 2, 1]


def test_run_by_checks_the_method() -> None:
    with pytest.raises(UserError, match="--vertical-sync applies to --method pipedream, not 2bw"):
        chain(2, 4).run_by(Method.TWO_BW, vertical_sync=True)
    with pytest.raises(UserError, match="2bw needs at least as many micro-batches as stages"):
        chain(4, 2).run_by(Method.TWO_BW)


def test_cli_plans_and_simulates_async(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--micro", "4",
                     "--method", "pipedream", "--vertical-sync", "--profile", str(tiny_profile), "--out", str(plan))
    assert code == 0, text
    saved = json.loads(plan.read_text())
    assert (saved["method"], saved["weights"]) == ("pipedream", "vertical-sync")
    code, text = run(capsys, "simulate", "--plan", str(plan), "--profile", str(tiny_profile), "--method", "2bw",
                     "--out-dir", str(tmp_path / "sim"), "--checkpoint-every", "2")
    assert code == 0, text
    assert "2bw runs batches without a flush" in text and "samples/s" in text
    assert "a checkpoint every 2 steps drains the pipeline each time" in text
    code, text = run(capsys, "simulate", "--plan", str(plan), "--profile", str(tiny_profile), "--vertical-sync",
                     "--out-dir", str(tmp_path / "sim"))
    assert code == 2 and "--vertical-sync applies to --method pipedream" in text
