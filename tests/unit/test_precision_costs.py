"""A plan at a precision: its messages, simulated communication and memory, and the profile it is
costed with (pipetrain.cost, pipetrain.simulate.memory, pipetrain.api, the CLI; issue 28 items 1-2)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from pipetrain import api
from pipetrain.cli import main
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.precision import Precision, message_bytes_factor
from pipetrain.profile.table import Profile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import stage_memory
from pipetrain.viz.tables import memory_table

BATCH = 8
SLOW = Link(latency_s=1e-5, bandwidth_bytes_per_s=1e9)  # a slow link, so messages weigh
CLUSTER = Cluster.homogeneous("a100", 1, 2, SLOW, SLOW)


@functools.cache
def profile(precision: Precision) -> Profile:
    return estimate_profile(build_model("gpt-tiny"), "a100", BATCH, precision=precision)


def planned(precision: Precision) -> tuple[Plan, CostModel]:
    """gpt-tiny in two GPipe stages of 4 micro-batches on two A100s, at ``precision``."""
    cost = CostModel(profile(precision), CLUSTER)
    constraints = api.Constraints(method=api.Method.GPIPE, n_stages=2, n_micro=4)
    return api.plan(build_model("gpt-tiny"), profile(precision), CLUSTER, batch_size=BATCH,
                    constraints=constraints, precision=precision).plan, cost


def send_s(plan: Plan, cost: CostModel) -> float:
    """Seconds of every send in ``plan``'s simulated timeline, less their links' latency."""
    timeline = simulate(build_schedule(plan), plan, cost)
    sends = [e for e in timeline.events if e.action.kind in (ActionKind.SEND_F, ActionKind.SEND_B)]
    assert sends
    return sum(e.duration_s - SLOW.latency_s for e in sends)


def test_a_bf16_plans_messages_are_half_the_bytes_and_its_sends_half_the_time() -> None:
    plan32, cost32 = planned("fp32")
    plan16, cost16 = planned("bf16")
    assert (plan32.precision, plan16.precision) == ("fp32", "bf16")
    assert [s.layers for s in plan16.stages] == [s.layers for s in plan32.stages]
    first = plan32.stages[0].layers
    assert cost16.output_bytes(first, 4) == message_bytes_factor("bf16") * cost32.output_bytes(first, 4)
    assert send_s(plan16, cost16) == pytest.approx(0.5 * send_s(plan32, cost32))
    # (its iteration is not faster: gpt-tiny's kernels are launch-bound, and bf16 adds the weights' casts)


def test_memory_of_a_bf16_plan() -> None:
    plan32, cost32 = planned("fp32")
    plan16, cost16 = planned("bf16")
    for k, (m32, m16) in enumerate(zip(stage_memory(plan32, cost32, optimizer="adam"),
                                       stage_memory(plan16, cost16, optimizer="adam"), strict=True)):
        # float32 master weights, gradients and Adam's moments
        assert (m16.weight_bytes, m16.gradient_bytes, m16.optimizer_state_bytes) == \
            (m32.weight_bytes, m32.gradient_bytes, m32.optimizer_state_bytes)
        layers = plan16.stages[k].layers
        casts = profile("bf16").cast_weight_bytes(layers)
        assert profile("fp32").cast_weight_bytes(layers) == 0 < casts
        # GPipe keeps all 4 micro-batches of 2: each its activations, in bf16, and its casts of the weights
        per_sample = profile("bf16").saved_bytes_per_sample(layers)
        assert cost16.saved_bytes(layers, 2) == 2 * per_sample + casts
        assert m16.activation_bytes == 4 * (2 * per_sample + casts)
        assert 2 * per_sample < 0.6 * cost32.saved_bytes(layers, 2)
    assert "activations" in memory_table(stage_memory(plan16, cost16), [CLUSTER.devices[0].memory_bytes] * 2)


def test_a_plan_is_costed_only_at_its_precision() -> None:
    plan16, _ = planned("bf16")
    with pytest.raises(UserError, match="is at fp32 but the plan is at bf16"):
        api.predict(plan16, profile("fp32"), CLUSTER)
    with pytest.raises(UserError, match="the given profile of 'gpt-tiny' is at fp32 but the plan is at bf16"):
        api.cluster_profiles(build_model("gpt-tiny"), CLUSTER, BATCH, profile=profile("fp32"), precision="bf16")
    assert api.cluster_profiles(build_model("gpt-tiny"), CLUSTER, BATCH, precision="bf16") == {"a100": profile("bf16")}
    with pytest.raises(UserError, match="different precisions"):
        CostModel({"a100": profile("bf16"), "v100": profile("fp32")},
                  Cluster.homogeneous("a100", 1, 1, SLOW, SLOW))


def test_plan_and_simulate_at_a_precision_from_the_cli(tmp_path: Path) -> None:
    plan, sim = tmp_path / "plan.json", tmp_path / "sim"
    assert main(["plan", "--model", "gpt-tiny", "--batch", "8", "--ranks", "2", "--method", "gpipe",
                 "--estimate", "a100", "--precision", "bf16", "--out", str(plan)]) == 0
    assert json.loads(plan.read_text())["precision"] == "bf16"
    assert main(["simulate", "--plan", str(plan), "--estimate", "a100", "--out-dir", str(sim)]) == 0
    fp32 = tmp_path / "fp32.json"
    assert main(["profile", "--model", "gpt-tiny", "--batch", "8", "--estimate", "a100", "--out", str(fp32)]) == 0
    assert main(["simulate", "--plan", str(plan), "--profile", str(fp32), "--out-dir", str(sim)]) == UserError.exit_code
