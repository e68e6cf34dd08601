"""The receive pre-posting pass (:mod:`pipetrain.schedule.prepost`): per rank and step program, how
deep each channel is posted at the step's start, from the receives' bytes and the backend's budget;
and the simulator reporting its buffers (``Timeline.prepost_bytes``) without changing any time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.action import Action
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.prepost import (
    PREPOST_BYTES,
    PREPOSTED,
    Prepost,
    device_backend,
    prepost_budget,
    prepost_program,
    prepost_schedule,
    step_programs,
)
from pipetrain.schedule.versions import batch_chunks
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile

# rank 1 of a 3-stage chain: activations from rank 0, gradients from rank 2, each of 4 samples
PROGRAM = [Action.parse(t) for t in (
    "1RECV_F0[0:4]<0", "1F0[0:4]", "1RECV_F1[4:8]<0", "1F1[4:8]", "1RECV_F2[8:12]<0", "1F2[8:12]",
    "1RECV_B0[0:4]<2", "1B0[0:4]", "1SEND_B0[0:4]>0", "1RECV_B1[4:8]<2", "1B1[4:8]", "1RECV_B2[8:12]<2",
    "1B2[8:12]", "1STEP",
)]
ACTIVATIONS, GRADIENTS = (0, "F"), (2, "B")


def _bytes(a: Action) -> int:
    """100 bytes per sample of an activation, 10 of a gradient."""
    return a.size * (100 if a.channel == "F" else 10)


def test_a_budget_of_nothing_posts_the_floor_per_channel() -> None:
    prepost = prepost_program(PROGRAM, _bytes, budget_bytes=0)
    assert prepost.depths == ((ACTIVATIONS, PREPOSTED), (GRADIENTS, PREPOSTED))
    assert prepost.nbytes == 2 * 400 + 2 * 40


def test_a_large_budget_posts_every_receive_of_the_step() -> None:
    prepost = prepost_program(PROGRAM, _bytes, budget_bytes=2**20)
    assert prepost.depth(ACTIVATIONS) == prepost.depth(GRADIENTS) == 3
    assert prepost.nbytes == 3 * 400 + 3 * 40
    assert prepost.depth((1, "F")) == 0  # a channel the step does not receive on


@pytest.mark.parametrize(("budget", "depth"), [(3 * 440, 3), (3 * 440 - 1, 2)])
def test_the_budget_counts_the_first_receives_of_every_channel_together(budget: int, depth: int) -> None:
    assert prepost_program(PROGRAM, _bytes, budget).depths == ((ACTIVATIONS, depth), (GRADIENTS, depth))


def test_a_channel_is_never_posted_deeper_than_its_receives() -> None:
    short = [a for a in PROGRAM if str(a) not in ("1RECV_B1[4:8]<2", "1RECV_B2[8:12]<2")]
    prepost = prepost_program(short, _bytes, budget_bytes=2**20)
    assert prepost.depths == ((ACTIVATIONS, 3), (GRADIENTS, 1)) and prepost.nbytes == 1200 + 40


def test_bounded_queues_post_their_depth_whatever_the_budget() -> None:
    assert prepost_program(PROGRAM, _bytes, 2**30, bound=1).depths == ((ACTIVATIONS, 1), (GRADIENTS, 1))
    assert prepost_program(PROGRAM, _bytes, 0, bound=3).nbytes == 3 * 440


def test_a_program_without_receives_posts_nothing() -> None:
    sends = [Action.parse(t) for t in ("0F0[0:4]", "0SEND_F0[0:4]>1", "0STEP")]
    assert prepost_program(sends, _bytes, PREPOST_BYTES) == Prepost()


def test_the_budget_follows_the_backend() -> None:
    assert prepost_budget("gloo") == PREPOST_BYTES and prepost_budget("nccl") == 0
    assert [device_backend(k) for k in ("cpu", "cpu#big", "a100", "fpga")] == ["gloo", "gloo", "nccl", "nccl"]


def _chain(method: Method, n_stages: int, batch: int, n_micro: int) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    return Plan("synthetic", "", batch, method,
                tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(n_stages)))


def test_an_asynchronous_schedule_is_annotated_per_batch_chunk() -> None:
    plan = replace(_chain(Method.TWO_BW, 2, 8, 4), weights=WeightPolicy.TWO_BW)
    schedule = build_schedule(plan, 3)
    annotation = prepost_schedule(schedule, plan, lambda r, a: _bytes(a), [0, 0])
    for rank, program in schedule:
        chunks = batch_chunks(program, plan.batch_size, 3)
        assert step_programs(program, plan, 3) == chunks
        assert annotation[rank] == tuple(prepost_program(c, _bytes, 0) for c in chunks)


def test_a_synchronous_schedule_has_one_step_per_rank() -> None:
    plan = _chain(Method.ONE_F_ONE_B, 3, 12, 3)
    annotation = prepost_schedule(build_schedule(plan), plan, lambda r, a: _bytes(a), [2**20] * 3)
    assert [len(steps) for steps in annotation] == [1, 1, 1]
    assert annotation[1][0] == prepost_program(build_schedule(plan).ranks[1], _bytes, 2**20)
    assert annotation[0][0].depths == (((1, "B"), 3),) and annotation[2][0].depths == (((1, "F"), 3),)


def _cost(kind: str, n: int, output_bytes: int = 256) -> CostModel:
    cluster = Cluster.local(n, link=Link(1e-4, 1e9))
    cluster = replace(cluster, devices=tuple(replace(d, kind=kind) for d in cluster.devices))
    return CostModel(flat_profile(n, 1.0, 2.0, output_bytes=output_bytes), cluster)


@pytest.mark.parametrize(("kind", "expected"), [("cpu", [4 * 256, 4 * 256]), ("a100", [2 * 256, 2 * 256])])
def test_the_simulator_reports_the_buffers_of_its_devices_backend(kind: str, expected: list[int]) -> None:
    """1F1B on 2 ranks, 4 single-sample micro-batches, 256 bytes a message: a CPU rank (gloo) posts
    the step's 4 receives, a GPU rank (NCCL, no budget) the floor of 2."""
    plan = _chain(Method.ONE_F_ONE_B, 2, 4, 4)
    timeline = simulate(build_schedule(plan), plan, _cost(kind, 2))
    assert list(timeline.prepost_bytes) == expected


def test_local_learning_posts_its_queue_depth_in_the_simulator() -> None:
    plan = replace(_chain(Method.LOCAL, 2, 6, 6), weights=WeightPolicy.LOCAL, params=LocalParams("linear", 3))
    timeline = simulate(build_schedule(plan), plan, _cost("cpu", 2))
    assert list(timeline.prepost_bytes) == [0, 3 * 256]


def test_reporting_the_buffers_changes_no_simulated_time() -> None:
    """The pass only reads the schedule: every event is where the communication model puts it."""
    plan = _chain(Method.ONE_F_ONE_B, 3, 8, 4)
    cpu, gpu = (simulate(build_schedule(plan), plan, _cost(kind, 3)) for kind in ("cpu", "a100"))
    assert cpu.events == gpu.events and cpu.prepost_bytes != gpu.prepost_bytes


def test_the_timeline_file_keeps_the_buffers() -> None:
    plan = _chain(Method.GPIPE, 2, 4, 2)
    timeline = simulate(build_schedule(plan), plan, _cost("cpu", 2))
    assert type(timeline).from_json(timeline.to_json()).prepost_bytes == timeline.prepost_bytes == (1024, 1024)
