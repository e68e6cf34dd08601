"""What the runtime pays beside compute, in the simulator: per-message host seconds (MessageHost) and
the auxiliary heads' activations and width (method local)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel, MessageHost
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, MethodParams, WeightPolicy
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.local import build_local_plan, min_max_cuts
from pipetrain.planners.partition import balanced_partition
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.heads import head_profiles
from pipetrain.profile.table import LayerProfile
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks
from pipetrain.simulate.steady import steady_state
from pipetrain.simulate.timeline import Timeline
from tests.conftest import flat_profile
from tests.unit.test_local_schedule import local_chain

FREE = Link(0.0, 1e30)
HOST = MessageHost(send_s=0.1, recv_s=0.2)
PER_BYTE = MessageHost(send_per_byte_s=1e-4, recv_per_byte_s=2e-4)  # 1000-byte messages: the same seconds


@pytest.mark.parametrize("host", [HOST, PER_BYTE])
def test_a_message_keeps_its_sender_and_receiver_busy(host: MessageHost) -> None:
    """Stage 0: F [0, 1], its send's host work [1, 1.1], B; stage 1 waits for the message (at 1.1),
    takes it [1.1, 1.3], then F and B (3 s): 4.3 s where free messages give 4 s."""
    cost = CostModel(flat_profile(2, output_bytes=1000), Cluster.local(2, link=FREE))
    plan = local_chain(2, 1, 1)
    assert simulate(build_schedule(plan), plan, cost).iteration_s == pytest.approx(4.0)
    timeline = simulate(build_schedule(plan), plan, cost.with_message_host(host))
    assert timeline.iteration_s == pytest.approx(4.3)
    spans = {(e.rank, e.action.kind): (e.start_s, e.end_s) for e in timeline.events}
    assert spans[(0, ActionKind.SEND_F)] == pytest.approx((1.1, 1.1))  # the link's event: it leaves at 1.1
    assert spans[(0, ActionKind.B)] == pytest.approx((1.1, 3.1))
    assert spans[(1, ActionKind.RECV_F)] == pytest.approx((0.0, 1.3))  # waiting, then taking it
    assert [e.action.kind for e in timeline.events].count(ActionKind.SEND_F) == 1
    rank_s = {(e.rank, e.action.kind): e.rank_s for e in timeline.events}
    assert rank_s[(0, ActionKind.SEND_F)] == pytest.approx(0.1)  # what the rank spent, as a measured SEND's span
    assert rank_s[(1, ActionKind.RECV_F)] == pytest.approx(1.3)
    assert Timeline.from_json(timeline.to_json()).events == timeline.events
    free = simulate(build_schedule(plan), plan, cost)
    assert [e.rank_s for e in free.events if e.action.kind is ActionKind.SEND_F] == [0.0]  # sends cost it nothing


def test_gradients_pay_their_messages_host_seconds_too() -> None:
    """1F1B, one micro-batch: F [0, 1], send 0.1; stage 1 takes it [1.1, 1.3], F + B till 4.3, sends
    its gradient [4.3, 4.4]; stage 0 takes it [4.4, 4.6] and runs B till 6.6 (free messages: 6 s)."""
    cost = CostModel(flat_profile(2), Cluster.local(2, link=FREE))
    plan = replace(local_chain(2, 1, 1), method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams())
    assert simulate(build_schedule(plan), plan, cost).iteration_s == pytest.approx(6.0)
    timeline = simulate(build_schedule(plan), plan, cost.with_message_host(HOST))
    assert timeline.iteration_s == pytest.approx(6.6)
    spans = {(e.rank, e.action.kind): (e.start_s, e.end_s) for e in timeline.events}
    assert spans[(1, ActionKind.SEND_B)] == pytest.approx((4.4, 4.4))
    assert spans[(0, ActionKind.B)] == pytest.approx((4.6, 6.6))


def test_steady_state_adds_each_stages_message_seconds() -> None:
    """Per micro-batch stage 1 pays F + B (3 s), a receive (0.2) and a send (0.1): the slowest."""
    cost = CostModel(flat_profile(3), Cluster.local(3, link=FREE)).with_message_host(HOST)
    assert steady_state(local_chain(3, 8, 4), cost).batch_s == pytest.approx(4 * 3.3)


def test_message_costs_survive_copies_and_refuse_negative_seconds() -> None:
    cost = CostModel(flat_profile(2), Cluster.local(2, link=FREE)).with_message_host(HOST)
    assert cost.with_heads({}).message_host == HOST
    assert cost.on(Cluster.local(3, link=FREE)).message_host == HOST
    assert cost.send_host_s(10) == pytest.approx(0.1) and cost.recv_host_s(10) == pytest.approx(0.2)
    with pytest.raises(UserError, match=">= 0"):
        MessageHost(send_s=-1.0)


def _head(saved: int, saved_input: int) -> LayerProfile:
    return LayerProfile("aux:l0", (1, 2), (0.5, 0.5), (0.5, 0.5), 0, saved, 0, 0.0,
                        saved_input_bytes_per_sample=saved_input)


@pytest.mark.parametrize(("saved_input", "stage_saves_output", "head_bytes"), [(0, False, 100), (50, True, 70)])
def test_a_local_stage_holds_its_heads_activations(saved_input: int, stage_saves_output: bool,
                                                   head_bytes: int) -> None:
    """2 samples per micro-batch: stage 0 holds its 10 B/sample and its head's; the head's input counts
    once where the stage's last layer saves its output (30 B of it) already."""
    profile = flat_profile(2, saved_bytes=10)
    if stage_saves_output:
        layers = (replace(profile.layers[0], saved_output_bytes_per_sample=30), profile.layers[1])
        profile = replace(profile, layers=layers)
    cost = CostModel(profile, Cluster.local(2, link=FREE)).with_heads({"cpu": {"l0": _head(100, saved_input)}})
    plan = local_chain(2, 4, 2)
    assert activation_peaks(plan, cost) == (2 * (10 + head_bytes), 2 * 10)
    assert simulate(build_schedule(plan), plan, cost).peak_activation_bytes == (2 * (10 + head_bytes), 20)
    sync = replace(plan, method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams())
    assert activation_peaks(sync, cost) == (2 * 2 * 10, 2 * 10)  # no heads under backprop


def test_estimated_heads_save_activations_and_grow_with_their_width() -> None:
    graph = build_model("mlp-digits")
    profile = estimate_profile(graph, "v100", 8)
    first = [graph.names[0]]
    (narrow,), (wide,) = (head_profiles(graph, profile, "dgl", after=first, width=w).values() for w in (64, 128))
    assert 0 < narrow.saved_bytes_per_sample < wide.saved_bytes_per_sample
    assert narrow.parameter_bytes < wide.parameter_bytes
    assert narrow.forward_at(8) <= wide.forward_at(8)


@pytest.mark.parametrize("seed", range(5))
def test_min_max_cuts_without_starts_are_the_balanced_partitions(seed: int) -> None:
    rng = random.Random(seed)
    works, ends = [rng.uniform(0, 3) for _ in range(9)], [rng.uniform(0, 1) for _ in range(9)]
    for k in (1, 3, 9):
        assert min_max_cuts(works, [0.0] * 9, ends, k) == balanced_partition(works, k, ends)


def test_a_costly_receive_moves_the_cut() -> None:
    """Four 1 s layers on two stages: 2/2 without starts; a 1.5 s receive into layer 2 makes 1/3 (the
    earliest of the ties with 3/1: max(1, 3) = 3 < max(2, 2 + 1.5))."""
    works, ends = [1.0] * 4, [0.0] * 4
    assert min_max_cuts(works, [0.0] * 4, ends, 2) == (2, 2)
    assert min_max_cuts(works, [0.0, 0.0, 1.5, 0.0], ends, 2) == (1, 3)
    with pytest.raises(UserError, match="between 1 and 4"):
        min_max_cuts(works, [0.0] * 4, ends, 5)


def test_the_local_planner_weighs_the_messages_host_seconds() -> None:
    """Four equal layers (3 s) on two stages: 2/2, until the message after layer 1 costs its sender
    and receiver 4 s each (per byte; 0.04 s after the others): then 1/3 (max(3.04, 9.04) < 6 + 4)."""
    profile = flat_profile(4, output_bytes=100)
    big = replace(profile.layers[1], output_bytes_per_sample=10_000)
    profile = replace(profile, layers=(profile.layers[0], big, *profile.layers[2:]))
    plain = CostModel(profile, Cluster.local(4, link=FREE))
    costly = plain.with_message_host(MessageHost(send_per_byte_s=4e-4, recv_per_byte_s=4e-4))
    model = ModelRef.synthetic(["l0", "l1", "l2", "l3"])
    kwargs = {"aux": "linear", "queue_depth": 2, "n_stages": 2, "batch_size": 1, "n_micro": 1}
    assert [len(s.layers) for s in build_local_plan(model, plain, **kwargs).stages] == [2, 2]  # type: ignore[arg-type]
    assert [len(s.layers) for s in build_local_plan(model, costly, **kwargs).stages] == [1, 3]  # type: ignore[arg-type]
