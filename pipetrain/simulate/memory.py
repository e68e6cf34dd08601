"""The memory model: per stage, the bytes of weights, gradients, optimizer state and activations.

    memories = stage_memory(plan, cost, optimizer="adam")       # one StageMemory per stage
    memories[0].total_bytes

Weights are the profile's parameter bytes ``W``; gradients are one more copy of them; the optimizer
keeps ``c`` copies (:data:`~pipetrain.plan.memory.OPTIMIZER_STATE_COPIES`: plain SGD 0, SGD with
momentum 1 (the momentum buffer), Adam 2 (first and second moments)). Activations are the peak of
what a rank holds between forward and backward, found by replaying its program in order with
:class:`ActivationLedger`, the same accounting the event simulator uses
(:mod:`pipetrain.simulate.events`), so the peak depends only on the order of F and B, not on timing.
Per action, with ``A(b)`` the stage's saved bytes and ``I(b)`` its input bytes for ``b`` samples
(:meth:`~pipetrain.cost.CostModel.saved_bytes`, :meth:`~pipetrain.cost.CostModel.input_bytes`)::

    stage keeps activations    F of b samples: +A(b)     B of b samples: −A(b)
    stage recomputes           F: +I(b) (stashed input)  B: holds A(b) while it runs, then −I(b)

A stage recomputes (activation checkpointing) when :meth:`~pipetrain.plan.plan.Plan.recomputes` says
so: its :attr:`~pipetrain.plan.plan.StagePlan.recompute` is set, or its two partitions differ.

Method ``local`` adds the stage's auxiliary head: its F keeps the head's saved bytes ``H(b)`` too
(:meth:`~pipetrain.cost.CostModel.head_saved_bytes`; 0 without heads in the cost model), its B
releases them, so a local stage holds ``A(b) + H(b)`` at its peak (F and B follow each other).

A split backward (``zb1``, ``zb2``, ``interleaved-zb``, ``zbv``: a program with W actions; Qi et al.
2024) releases at W instead of B: the B keeps the graph for the W (``−A(b)`` moves from B to W), and
adds the output gradients the W needs, ``G(b)`` (one per parameter owner's output,
:meth:`~pipetrain.cost.CostModel.held_grad_bytes`; :mod:`pipetrain.graph.split_backward`)::

    split backward                F: +A(b)                  B: +G(b)      W: −A(b) − G(b)
    split backward, recomputes    F: +I(b)                  B: +A(b) + G(b) (the re-run's graph, kept
                                                            for W), then −I(b)   W: −A(b) − G(b)

For ``m`` equal micro-batches of ``b = B/m`` samples on stage ``k`` of ``K`` (``k = 0..K−1``) the
replay reproduces these closed forms (checked on a grid by the unit tests)::

    GPipe (fill-drain)            m · A(b) = A(B)            all micro-batches in flight
    1F1B with a flush             min(m, K − k) · A(b)       the in-flight count (docs/algorithms.md §1, §3.4)
    GPipe, recompute              m · I(b) + A(b)            stage inputs + one micro-batch re-run
    1F1B, recompute               min(m, K − k) · I(b) + A(b)

and the stage's total is ``(2 + c) · W + activations``. An asynchronous method (docs/algorithms.md
§3.5) holds ``v`` weight versions instead of one, the most its schedule's ranks hold at once
(:func:`~pipetrain.schedule.versions.held_versions`): ``(v + 1 + c) · W + activations``, the
activations being those of the micro-batches in flight across batches (the optimizer keeps one
state, for the newest version). These are BaPipe's per-stage memories
(docs/algorithms.md §4.2, reconstruction; ``S`` stages numbered ``1..S`` there)::

    Mem_k(GPipe) = W_k · c_opt + m · A_k(b)
    Mem_k(1F1B)  = W_k · c_opt + (S − k + 1) · A_k(b)

with ``c_opt = 2 + c``; the replay adds the ``min`` with ``m`` (fewer micro-batches than stages
keep all ``m`` in flight) and the recompute forms of docs/algorithms.md §2.6. Unequal micro-batches
(UMPIPE's ``uedp``, 1F1B with per-stage partitions) have no closed form; the replay covers them as
well.

Mixed precision (``bf16``, ``fp16``; the profile's precision, which is the plan's,
:attr:`~pipetrain.cost.CostModel.precision`) keeps the weights, their gradients and the optimizer
state in float32 (the master copies): ``W`` and the ``(2 + c) · W`` are unchanged. The runtime runs
each F under its own ``torch.autocast``, which casts the weights of the stage's matmuls and
convolutions to the compute dtype, and autograd keeps those casts (a Linear's ``W^T``, for its input
gradient) until the micro-batch's B: every micro-batch in flight holds its own copy. So ``A(b)``
is the profile's per-sample saved bytes at the compute dtype, times ``b``, plus the stage's cast
weights ``C`` (:meth:`~pipetrain.cost.CostModel.saved_bytes`; ``C`` = 0 at fp32), and the forms
above hold with that ``A``: e.g. 1F1B keeps ``min(m, K − k) · (A₁ · b + C)``.

``A(b)`` is the stage's, not a sum over its layers: a tensor that one layer saves as its output and
the next as its input counts once, and the last stage adds what the loss saves
(:meth:`~pipetrain.profile.table.Profile.saved_bytes_per_sample`). Bytes are the profile's, so
allocator slack and workspace are not counted. Not modelled: stage 0 loads the whole mini-batch at
once and its first layer saves views of it, so the runtime holds the whole input batch while any of
its micro-batches is in flight (the last stage likewise its targets); under 1F1B or recompute the
prediction for stage 0 is then low by up to ``I(B) − I(b)`` (−16 % on a small MLP's first stage in
``tests/gloo/test_memory_model.py``; other stages there are within 3 %, the last ones low by their
targets).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.cost import CostModel
from pipetrain.plan.memory import OPTIMIZER_STATE_COPIES, OptimizerName, StageMemory, check_optimizer
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule
from pipetrain.schedule.versions import held_versions

__all__ = ["ActivationLedger", "activation_peaks", "device_memory", "memory_need", "overflows", "stage_memory"]


class ActivationLedger:
    """The activation bytes one rank holds as its F and B actions complete, and their peak.

    The one accounting of held activations: the event simulator keeps one ledger per rank, and
    :func:`activation_peaks` replays each rank's program through one (module docstring).

    Args:
        plan: the plan; says which stage's layers an action runs and whether the stage recomputes.
        cost: the profile's bytes.
        split: the rank's program splits backward into B and W (it has W actions): W releases.
    """

    def __init__(self, plan: Plan, cost: CostModel, split: bool = False) -> None:
        self._plan = plan
        self._split = split
        self._cost = cost
        self._heads = not plan.spec.gradients_cross_stages  # local learning: the heads' activations too
        self.held_bytes = 0
        self.peak_bytes = 0

    def record(self, action: Action) -> None:
        """Account for ``action`` having run; actions other than F, B and W hold nothing (module docstring)."""
        if action.kind not in (ActionKind.F, ActionKind.B, ActionKind.W) or (
                action.kind is ActionKind.W and not self._split):
            return
        layers, recompute = self._plan.stages[action.stage].layers, self._plan.recomputes(action.stage)
        saved = self._cost.saved_bytes(layers, action.size)
        if self._heads:
            saved += self._cost.head_saved_bytes(layers, action.size)
        stashed = self._cost.input_bytes(layers, action.size) if recompute else 0
        grads = self._cost.held_grad_bytes(layers, action.size) if self._split else 0
        if action.kind is ActionKind.F:
            self.held_bytes += stashed if recompute else saved
        elif action.kind is ActionKind.W:  # a split backward's release: its graph and the gradients it used
            self.held_bytes -= saved + grads
        elif recompute:  # the re-run's graph while B runs (split: until W), then the stashed input goes
            self.held_bytes += saved + grads
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            self.held_bytes -= stashed + (0 if self._split else saved)
        else:  # a fused B releases; a split B keeps its graph for W and adds the gradients W needs
            self.held_bytes += grads if self._split else -saved
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)


def activation_peaks(plan: Plan, cost: CostModel, schedule: Schedule | None = None) -> tuple[int, ...]:
    """Per rank, the peak held activation bytes of one iteration, replaying its program in order.

    Equals the event simulator's ``Timeline.peak_activation_bytes`` for the same schedule.

    Args:
        plan: the plan the schedule runs.
        cost: the profile's bytes.
        schedule: the schedule to replay; default :func:`~pipetrain.schedule.generators.build_schedule`.
    """
    schedule = build_schedule(plan) if schedule is None else schedule
    peaks = []
    for _, program in schedule:
        ledger = ActivationLedger(plan, cost, any(a.kind is ActionKind.W for a in program))
        for action in program:
            ledger.record(action)
        peaks.append(ledger.peak_bytes)
    return tuple(peaks)


def stage_memory(
    plan: Plan, cost: CostModel, schedule: Schedule | None = None, optimizer: OptimizerName = "sgd",
    peaks: Sequence[int] | None = None,
) -> tuple[StageMemory, ...]:
    """Per stage, the predicted peak bytes of weights, gradients, optimizer state and activations.

    Args:
        plan: the stages (layers, ranks) and micro-batches.
        cost: the profile's bytes.
        schedule: the schedule whose order sets the activations; default the plan's own.
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"`` or ``"adamw"``
            (:data:`~pipetrain.plan.memory.OPTIMIZER_STATE_COPIES`).
        peaks: per rank, the peak activation bytes if already known (a synchronous plan's simulated
            ``Timeline.peak_activation_bytes``, which equals :func:`activation_peaks`); default: replayed.

    Raises:
        UserError: an unknown optimizer name.
    """
    copies = OPTIMIZER_STATE_COPIES[check_optimizer(optimizer)]
    if peaks is None or plan.asynchronous:
        schedule = build_schedule(plan) if schedule is None else schedule
        peaks = activation_peaks(plan, cost, schedule)
    memories = []
    for k, stage in enumerate(plan.stages):
        weights = cost.parameter_bytes(stage.layers)
        # a rank's peak covers all its stages (interleaved): counted once, on its first stage
        activations = max((peaks[r] for r in stage.ranks if r < len(peaks) and plan.stage_of_rank(r) == k), default=0)
        versions = 1
        if plan.asynchronous:
            assert schedule is not None
            versions = max(max(held_versions(schedule.ranks[r])) for r in stage.ranks)
        memories.append(StageMemory(versions * weights, weights, copies * weights, activations))
    return tuple(memories)


def device_memory(plan: Plan, cost: CostModel) -> tuple[int, ...]:
    """Per stage, the bytes of the smallest device that runs it."""
    return tuple(min(cost.cluster.devices[r].memory_bytes for r in stage.ranks) for stage in plan.stages)


def memory_need(
    plan: Plan, cost: CostModel, *, optimizer: OptimizerName = "sgd", peaks: Sequence[int] | None = None
) -> tuple[int, ...]:
    """Per stage, the predicted peak bytes of :func:`stage_memory` (largest over the stage's ranks):
    ``parameter_copies(optimizer)`` parameter-sized buffers plus the peak of held activations over
    the plan's schedule (``peaks``: as :func:`stage_memory`). Compare with :func:`device_memory`."""
    return tuple(m.total_bytes for m in stage_memory(plan, cost, optimizer=optimizer, peaks=peaks))


def overflows(
    plan: Plan, cost: CostModel, *, optimizer: OptimizerName = "sgd", peaks: Sequence[int] | None = None
) -> list[tuple[int, int, int]]:
    """``(stage, bytes needed, bytes its device has)`` for every stage whose predicted peak
    (:func:`memory_need`; ``peaks`` as there) exceeds its smallest device (:func:`device_memory`);
    empty when the plan fits."""
    needs = list(memory_need(plan, cost, optimizer=optimizer, peaks=peaks))
    if plan.spec.multi_stage:  # a rank holds all its chunks: compare the sum on its first stage
        for rank in range(plan.n_ranks):
            first, *rest = plan.stages_of_rank(rank)
            needs[first] += sum(needs[k] for k in rest)
            for k in rest:
                needs[k] = 0
    return [(k, need, have) for k, (need, have) in enumerate(zip(needs, device_memory(plan, cost), strict=True))
            if need > have]
