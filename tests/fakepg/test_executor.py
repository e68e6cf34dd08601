"""The interpreter and its handlers, in one process (levels a and b).

* With the ``fake`` process-group backend, one process plays any rank of a 4-stage plan: the
  rank's stage is built, every action of its real program goes through the handler table and the
  real transport, and the buffers are empty at the end of the step.
* With an in-memory transport, one process runs *all* ranks, interleaved as the schedule allows,
  and must reproduce unpipelined training exactly (including re-chunking between stages).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime import TrainConfig, reference_train
from pipetrain.runtime.interp.chain import ChainKernel
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.executor import HANDLERS, check_runnable, run_program
from pipetrain.runtime.interp.keeping import Recompute
from pipetrain.runtime.interp.rank_setup import build_rank_context, stage_specs, stage_state_dict
from pipetrain.runtime.interp.recorder import StepRecorder
from pipetrain.runtime.interp.transport import Direction, Transport
from pipetrain.runtime.job.data import make_batch
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule

from ..gloo.models import chain_plan, mlp_graph, uneven_plan

fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")

CONFIG = TrainConfig(steps=2, warmup_steps=0, lr=0.05, progress=False)


@pytest.fixture
def fake_group(request: pytest.FixtureRequest) -> Iterator[int]:
    rank: int = request.param
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=4)
    try:
        yield rank
    finally:
        dist.destroy_process_group()


def test_every_action_kind_has_a_handler() -> None:
    assert set(HANDLERS) == set(ActionKind)


@pytest.mark.parametrize("fake_group", [0, 1, 2, 3], indirect=True)
def test_fake_group_runs_any_rank(fake_group: int) -> None:
    rank = fake_group
    graph = mlp_graph()
    plan = chain_plan(graph, 4, 12, 3, Method.ONE_F_ONE_B)
    program = build_schedule(plan).ranks[rank]
    ctx = build_rank_context(graph, plan, rank, Transport(torch.device("cpu")), CONFIG.build_optimizer)
    assert ctx.stage == rank and ctx.is_first == (rank == 0) and ctx.is_last == (rank == 3)
    state = stage_state_dict(ctx, graph.layers_named(plan.stages[rank].layers), buffers=True)
    assert [n.split(".")[0] for n in state] == [
        name for name in plan.stages[rank].layers for _ in range(2)
    ]
    x, y = make_batch(graph, 12, 0, 0, "synthetic")
    ctx.begin_step(x, y)
    recorder = StepRecorder(rank)
    recorder.start_step()
    run_program(ctx, program, (recorder,))
    recorder.end_step()
    assert [e.action for e in recorder.steps[0]] == list(program)
    ctx.transport.wait_sends()  # as the job does once the program (its STEP included) is done
    assert ctx.transport.n_pending == 0
    assert not ctx.kernel.held() and ctx.meter.live_bytes == 0 and ctx.meter.peak_bytes > 0
    assert (ctx.step_loss() is not None) == (rank == 3)


def test_stage_specs() -> None:
    graph = mlp_graph(features=8, width=16, classes=4)
    assert stage_specs(graph, [0, 1]) == (TensorSpec((8,)), TensorSpec((16,)))
    assert stage_specs(graph, [4]) == (TensorSpec((16,)), TensorSpec((4,)))


def test_misplaced_or_unsupported_w_is_rejected_before_launch() -> None:
    """A W needs its B first (the validator), and a plan whose B and W the runtime can split."""
    plan = Plan("m", "", 2, Method.GPIPE, (StagePlan(("l0",), (0,), (2,), (2,)),))
    w = Schedule.from_lists([[Action.parse("0F0[0:2]"), Action.parse("0W0[0:2]"), Action.parse("0STEP")]])
    with pytest.raises(UserError, match="W before a B"):
        check_runnable(w, plan)
    split = Schedule.from_lists([[Action.parse(t) for t in ("0F0[0:2]", "0B0[0:2]", "0W0[0:2]", "0STEP")]])
    check_runnable(split, plan)
    check_runnable(split, plan.with_recompute())  # a recomputing stage re-runs forward at B, keeps it for W
    with pytest.raises(UserError, match="split backward"):
        check_runnable(split, replace(plan, method=Method.LOCAL, weights=WeightPolicy.LOCAL))


def test_backward_without_matching_forward_raises() -> None:
    ctx = _local_context(uneven_plan(mlp_graph(), [(4,)]), 0)
    x, y = make_batch(mlp_graph(), 4, 0, 0, "synthetic")
    ctx.begin_step(x, y)
    HANDLERS[ActionKind.F](ctx, Action.parse("0F0[0:4]"))
    with pytest.raises(UserError, match=r"no forward covered exactly \[0:2\)"):
        HANDLERS[ActionKind.B](ctx, Action.parse("0B0[0:2]"))


def test_recompute_keeps_only_inputs_and_rejects_dropout() -> None:
    plan = uneven_plan(mlp_graph(), [(4,), (4,)], [(2, 2), (4,)])
    ctx = _local_context(plan, 0)
    assert isinstance(ctx.kernel, ChainKernel) and isinstance(ctx.kernel.keeping, Recompute)
    x, y = make_batch(mlp_graph(), 4, 0, 0, "synthetic")
    ctx.begin_step(x, y)
    HANDLERS[ActionKind.F](ctx, Action.parse("0F0[0:4]"))
    assert ctx.kernel.held() == {"stashed inputs": [(0, 4)]} and ctx.meter.live_bytes == x.nbytes
    torch.manual_seed(0)
    dropout = LayerGraph.from_sequential(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Linear(8, 4)),
                                         input=TensorSpec((8,)), target=TensorSpec((), "int64", high=4))
    with pytest.raises(UserError, match=r"stage 0 recomputes .* dropout"):
        _local_context(uneven_plan(dropout, [(4,), (4,)], [(2, 2), (4,)]), 0, graph=dropout)


@pytest.mark.parametrize("method", [Method.GPIPE, Method.ONE_F_ONE_B])
def test_recompute_replays_dropout(method: Method) -> None:
    """A recomputing stage's re-run draws the dropout masks its F drew and leaves the random stream as it
    was: training equals the run that keeps activations, to the bit."""
    torch.manual_seed(0)
    graph = LayerGraph.from_sequential(
        nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)),
        input=TensorSpec((8,)), target=TensorSpec((), "int64", high=4))
    plan = chain_plan(graph, 2, 8, 4, method)
    torch.manual_seed(5)
    kept = _run_all_ranks(graph, plan, 2)
    torch.manual_seed(5)
    recomputed = _run_all_ranks(graph, plan.with_recompute(), 2)
    assert kept.keys() == recomputed.keys() and all(torch.equal(kept[k], recomputed[k]) for k in kept)


def test_step_with_unconsumed_data_raises() -> None:
    ctx = _local_context(chain_plan(mlp_graph(), 2, 4, 1), 0)
    x, y = make_batch(mlp_graph(), 4, 0, 0, "synthetic")
    ctx.begin_step(x, y)
    with pytest.raises(RuntimeError, match=r"unconsumed data: input activations \[\(0, 4\)\]"):
        HANDLERS[ActionKind.STEP](ctx, Action.parse("0STEP"))


# ---- all ranks in one process ---------------------------------------------------------------


Queues = dict[tuple[int, int, Direction], deque[torch.Tensor]]


class _Loopback(Transport):
    """An in-memory transport: messages wait in FIFO queues per (source, destination, direction)."""

    def __init__(self, rank: int, queues: Queues) -> None:
        super().__init__(torch.device("cpu"))
        self.rank = rank
        self.queues = queues

    def send(self, tensor: torch.Tensor, peer: int, direction: Direction) -> None:
        self.queues.setdefault((self.rank, peer, direction), deque()).append(tensor.clone())

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, direction: Direction) -> torch.Tensor:
        tensor = self.queues[(peer, self.rank, direction)].popleft()
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype
        return tensor

    def ready(self, action: Action) -> bool:
        direction = Direction.ACTIVATION if action.kind is ActionKind.RECV_F else Direction.GRADIENT
        assert action.peer is not None
        return bool(self.queues.get((action.peer, self.rank, direction)))


def _local_context(plan: Plan, rank: int, queues: Queues | None = None, graph: LayerGraph | None = None) -> RankContext:
    transport = _Loopback(rank, {} if queues is None else queues)
    return build_rank_context(graph or mlp_graph(), plan, rank, transport, CONFIG.build_optimizer)


def _run_all_ranks(graph: LayerGraph, plan: Plan, steps: int) -> dict[str, torch.Tensor]:
    """Interleave every rank's program in one process, as far as each message allows."""
    schedule, queues = build_schedule(plan), Queues()
    contexts = [_local_context(plan, r, queues, graph) for r in range(plan.n_ranks)]
    for step in range(steps):
        x, y = make_batch(graph, plan.batch_size, step, CONFIG.seed, "synthetic")
        for ctx in contexts:
            ctx.begin_step(x, y)
        positions = [0] * plan.n_ranks
        while any(p < len(prog) for p, prog in zip(positions, schedule.ranks, strict=True)):
            progressed = False
            for rank, program in schedule:
                while positions[rank] < len(program):
                    action = program[positions[rank]]
                    transport = contexts[rank].transport
                    assert isinstance(transport, _Loopback)
                    if action.kind in (ActionKind.RECV_F, ActionKind.RECV_B) and not transport.ready(action):
                        break
                    HANDLERS[action.kind](contexts[rank], action)
                    positions[rank] += 1
                    progressed = True
            assert progressed, f"deadlock at positions {positions}"
    params: dict[str, torch.Tensor] = {}
    for ctx in contexts:
        params.update(stage_state_dict(ctx, graph.layers_named(plan.stages[ctx.stage].layers), buffers=True))
    return params


def _relu_stage_graph() -> LayerGraph:
    """Linear, ReLU, Linear: cut in three, the middle stage has no parameters."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return LayerGraph.from_sequential(model, input=TensorSpec((8,)), target=TensorSpec((), "int64", high=4))


PLANS = {
    "gpipe-3x4": (mlp_graph(), chain_plan(mlp_graph(), 3, 10, 4)),
    "1f1b-5x8": (mlp_graph(), chain_plan(mlp_graph(), 5, 10, 8, Method.ONE_F_ONE_B)),
    "rechunk": (mlp_graph(), uneven_plan(mlp_graph(), [(4, 6), (1, 2, 3, 4), (10,)])),
    "rechunk-singles": (mlp_graph(), uneven_plan(mlp_graph(), [(1,) * 10, (7, 3), (2, 2, 2, 2, 2)])),
    "parameter-free-stage": (_relu_stage_graph(), chain_plan(_relu_stage_graph(), 3, 6, 2)),
    "recompute-dual": (mlp_graph(), uneven_plan(mlp_graph(), [(4, 6), (1, 2, 3, 4), (10,)],
                                                [(3, 3, 4), (1, 2, 3, 4), (1,) * 10])),
    "recompute-all": (mlp_graph(), chain_plan(mlp_graph(), 3, 10, 4).with_recompute()),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_all_ranks_in_one_process_match_reference(name: str) -> None:
    graph, plan = PLANS[name]
    params = _run_all_ranks(graph, plan, CONFIG.steps)
    reference = reference_train(graph, plan.batch_size, CONFIG)
    assert set(params) == set(reference.state_dict)
    for key, value in reference.state_dict.items():
        torch.testing.assert_close(params[key], value, atol=1e-6, rtol=0)


def test_reference_is_sensitive_to_gradient_scaling() -> None:
    """Guard: scaling gradients by the micro-batch count (torch's default) would be caught."""
    plan = PLANS["gpipe-3x4"][1]
    reference = reference_train(mlp_graph(), plan.batch_size, CONFIG)
    scaled = reference_train(mlp_graph(), plan.batch_size, TrainConfig(steps=2, warmup_steps=0, lr=0.05 / 4,
                                                                       progress=False))
    diff = max((reference.state_dict[k] - scaled.state_dict[k]).abs().max().item() for k in reference.state_dict)
    assert diff > 1e-4

