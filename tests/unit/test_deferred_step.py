"""2bw's deferred steps under clipping (:mod:`pipetrain.runtime.interp.weights`): a STEP whose norm is
in flight stays pending until an F on a newer version or the next STEP needs it, the next batch's
gradients kept apart meanwhile; the last STEP finishes at once; the step keeps its STEP's learning
rates. A dry run of the chunks over a grid of
stage and micro-batch counts shows that the rule never waits across the barrier between chunks,
where finishing every step at its STEP would."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest
import torch
from torch import nn

from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.step import OptimizerStep
from pipetrain.runtime.interp.transport import Transport
from pipetrain.runtime.interp.versions import WeightVersions
from pipetrain.runtime.interp.weights import VersionedWeights
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.versions import batch_chunks


@dataclass
class _Step:
    """An :class:`OptimizerStep` stand-in whose norm is in flight until finished; it records the
    gradient it steps on (None: none) and zeroes it, as the optimizer does."""

    layer: nn.Linear
    waits: bool = True
    stepped: list[float | None] = field(default_factory=list)

    def finish(self) -> None:
        grad = self.layer.weight.grad
        self.stepped.append(None if grad is None else float(grad))
        self.layer.weight.grad = None


def _weights(program: Sequence[str]) -> tuple[VersionedWeights, nn.Linear]:
    layer = nn.Linear(1, 1, bias=False)
    return VersionedWeights(WeightVersions(layer, [Action.parse(a) for a in program])), layer


def _step(weights: VersionedWeights, step: _Step) -> None:
    weights.after_step(Action(ActionKind.STEP, 0), cast(OptimizerStep, step), lambda a: None)


def test_a_pending_step_keeps_the_next_batch_gradients_apart() -> None:
    """Batch t + 1's backwards run while batch t's step waits for its norm: the step gets batch t's
    gradient alone, and batch t + 1's joins the module's once it is done."""
    weights, layer = _weights(["0F0[0:1]v0", "0B0[0:1]v0", "0F1[1:2]v0", "0B1[1:2]v0", "0F2[2:3]v1", "0STEP",
                               "0STEP"])
    layer.weight.grad = torch.ones(1, 1)  # batch t's
    first = _Step(layer)
    _step(weights, first)
    assert weights.pending is first and not first.stepped and weights.versions.latest == 0
    weights.versions.held[0]["weight"].grad = torch.full((1, 1), 2.0)  # batch t + 1's B on version 0
    weights.backward_done(Action.parse("0B1[1:2]v0"))
    assert weights.pending is first and float(layer.weight.grad) == 1.0
    weights.call(Action.parse("0F2[2:3]v1"), torch.ones(1, 1))  # needs version 1: the step finishes
    assert first.stepped == [1.0] and weights.versions.latest == 1 and float(layer.weight.grad) == 2.0
    last = _Step(layer)
    _step(weights, last)  # the rank's last STEP finishes at once
    assert last.stepped == [2.0] and weights.versions.latest == 2


def test_the_next_step_finishes_a_pending_one() -> None:
    weights, layer = _weights(["0F0[0:1]v0"] + ["0STEP"] * 3)
    first = _Step(layer)
    _step(weights, first)
    weights.before_step(cast(Transport, None))  # the next STEP
    assert first.stepped == [None] and weights.pending is None and weights.versions.latest == 1


def test_a_step_not_in_flight_finishes_at_once() -> None:
    weights, layer = _weights(["0F0[0:1]v0"] + ["0STEP"] * 3)
    step = _Step(layer, waits=False)
    _step(weights, step)
    assert step.stepped == [None] and weights.pending is None and weights.versions.latest == 1


def test_the_step_keeps_its_learning_rate() -> None:
    """Finished after the job set the next batch's rate, the step still uses its STEP's."""
    layer = nn.Linear(1, 1, bias=False)
    layer.weight.data.fill_(1.0)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer.weight.grad = torch.ones(1, 1)
    ctx = cast(RankContext, type("Ctx", (), {"optimizer": optimizer, "meter": ActivationMeter([])})())
    step = OptimizerStep(ctx, None)
    optimizer.param_groups[0]["lr"] = 0.5
    step.finish()
    assert float(layer.weight.detach()) == pytest.approx(0.9)
    assert optimizer.param_groups[0]["lr"] == 0.5 and layer.weight.grad is None


def _two_bw(stages: int, micro: int) -> Plan:
    sizes = equal_sizes(2 * micro, micro)
    return Plan("m", "", 2 * micro, Method.TWO_BW,
                tuple(StagePlan((f"l{k}",), (k,), sizes, sizes) for k in range(stages)), weights=WeightPolicy.TWO_BW)


class _DryRun:
    """A 2bw run's chunks with a barrier after each, sends buffered, each STEP's norm an all-reduce done
    once every rank started it, and finished when needed (``deferred``) or in place at its STEP."""

    def __init__(self, plan: Plan, batches: int, deferred: bool) -> None:
        schedule = build_schedule(plan, batches)
        self.chunks = [batch_chunks(p, plan.batch_size, batches) for _, p in schedule]
        self.total = [sum(a.kind is ActionKind.STEP for a in p) for _, p in schedule]
        self.deferred = deferred
        n = schedule.n_ranks
        self.started, self.finished, self.blocked = [0] * n, [0] * n, [False] * n
        self.sent: Counter[tuple[int, int, str]] = Counter()

    def run(self) -> bool:
        """True when every chunk finishes and every step with it."""
        for t in range(len(self.chunks[0])):
            pos, progress = [0] * len(self.chunks), True
            while progress:
                progress = any([self._advance(r, self.chunks[r][t], pos) for r in range(len(self.chunks))])
            if any(p < len(c[t]) for p, c in zip(pos, self.chunks, strict=True)) or any(self.blocked):
                return False
        return self.finished == self.total

    def _settle(self, r: int) -> bool:
        if self.finished[r] < self.started[r]:
            if min(self.started) < self.started[r]:
                return False
            self.finished[r] = self.started[r]
        return True

    def _advance(self, r: int, chunk: Sequence[Action], pos: list[int]) -> bool:
        moved = False
        while True:
            if self.blocked[r]:
                if not self._settle(r):
                    return moved
                self.blocked[r], moved = False, True
            if pos[r] == len(chunk):
                return moved
            a = chunk[pos[r]]
            version = a.version or 0
            needs = (a.kind is ActionKind.STEP or (a.kind is ActionKind.F and version > self.finished[r])
                     or (a.kind is ActionKind.B and version != self.finished[r]))
            if needs and not self._settle(r):
                return moved
            if a.peer is not None:
                key = (r, a.peer, a.channel) if a.is_send else (a.peer, r, a.channel)
                if not a.is_send and self.sent[key] <= 0:
                    return moved
                self.sent[key] += 1 if a.is_send else -1
            if a.kind is ActionKind.STEP:
                self.started[r] += 1
                self.blocked[r] = not self.deferred or self.started[r] == self.total[r]
            pos[r] += 1
            moved = True


@pytest.mark.parametrize(("stages", "micro"), [(2, 2), (2, 5), (3, 3), (3, 4), (4, 4), (4, 7), (5, 6)])
def test_deferred_steps_never_wait_across_a_barrier(stages: int, micro: int) -> None:
    plan = _two_bw(stages, micro)
    assert _DryRun(plan, 4, deferred=True).run()
    assert not _DryRun(plan, 4, deferred=False).run()  # a blocking all-reduce at STEP would hang
