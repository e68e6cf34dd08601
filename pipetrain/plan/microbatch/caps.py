"""Memory caps: per stage, the largest micro-batch whose activations fit the stage's device.

PAPERS.md §1.12 (Memory). A ``uedp`` plan runs in flush (GPipe) order: every forward of a
mini-batch runs before its backwards, so a stage that keeps its autograd activations holds all
``B`` samples' of them at once, whatever its partition: its peak is

    state + saved_bytes(B)                                  (keeps activations)

and the micro-batch size does not change it. A stage that *recomputes* (its backward partition
differs from its forward one, or the plan's ``recompute`` flag is set; see
:meth:`~pipetrain.plan.plan.Plan.recomputes`) keeps only its inputs during forward and re-runs
forward for each backward micro-batch, holding that micro-batch's activations while it
back-propagates:

    state + input_bytes(B) + saved_bytes(b)                 (recomputes, b: its largest micro-batch)

which is the memory model's too (:mod:`pipetrain.plan.memory`, shared with the event simulator).
``state`` is the parameters plus one more copy per optimizer state (gradients for plain SGD:
:data:`SGD_STATE_COPIES` = 2; Adam would be 4). Only the recompute case has a micro-batch size to
cap, so :func:`microbatch_caps` bounds ``b`` by the second formula; :func:`fits_without_recompute`
says which stages fit the first, i.e. may keep their activations; :func:`memory_need` checks a
plan of any method with the memory model. Activation bytes are the profile's per-sample bytes
(:meth:`~pipetrain.cost.CostModel.saved_bytes`), so allocator slack and workspace are not counted:
a cap is an upper bound on what can fit, not a guarantee.
"""

from __future__ import annotations

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.memory import stage_memory
from pipetrain.plan.plan import Plan

__all__ = ["SGD_STATE_COPIES", "device_memory", "fits_without_recompute", "memory_need", "microbatch_caps",
           "overflows"]

SGD_STATE_COPIES = 2
"""Parameters + gradients: the bytes per parameter byte of plain SGD (no momentum)."""

_MIB = 2**20


def _device_bytes(plan: Plan, cost: CostModel, stage: int) -> int:
    """The memory of the smallest device running ``stage``."""
    return min(cost.cluster.devices[r].memory_bytes for r in plan.stages[stage].ranks)


def device_memory(plan: Plan, cost: CostModel) -> tuple[int, ...]:
    """Per stage, the bytes of the smallest device that runs it."""
    return tuple(_device_bytes(plan, cost, k) for k in range(plan.n_stages))


def _fixed_bytes(plan: Plan, cost: CostModel, stage: int, state_copies: int) -> tuple[int, int]:
    """``(state, inputs of B samples)`` of a recomputing stage, in bytes."""
    layers = plan.stages[stage].layers
    return state_copies * cost.parameter_bytes(layers), cost.input_bytes(layers, plan.batch_size)


def microbatch_caps(plan: Plan, cost: CostModel, *, state_copies: int = SGD_STATE_COPIES) -> tuple[int | None, ...]:
    """Per stage, the largest micro-batch ``b`` with ``state + input_bytes(B) + saved_bytes(b)`` within
    the device's memory; None where every ``b`` up to the batch fits.

    Args:
        plan: the stages (layers, ranks) and batch; its sizes are ignored.
        cost: the profile's bytes and the cluster's :attr:`~pipetrain.cluster.Device.memory_bytes`.
        state_copies: parameter-sized copies the optimizer keeps, parameters included (SGD: 2).

    Raises:
        UserError: a stage does not fit even with micro-batches of one sample; names the stage,
            what it needs and what its device has.
    """
    caps: list[int | None] = []
    batch = plan.batch_size
    for k, stage in enumerate(plan.stages):
        memory = _device_bytes(plan, cost, k)
        state, inputs = _fixed_bytes(plan, cost, k, state_copies)
        room = memory - state - inputs
        if cost.saved_bytes(stage.layers, batch) <= room:
            caps.append(None)
            continue
        one = cost.saved_bytes(stage.layers, 1)
        if one > room:
            layers = stage.layers[0] if len(stage.layers) == 1 else f"{stage.layers[0]} … {stage.layers[-1]}"
            raise UserError(
                f"stage {k} ({layers}, rank {','.join(map(str, stage.ranks))}) needs "
                f"{(state + inputs + one) / _MIB:.1f} MiB even with micro-batches of one sample "
                f"(parameters and optimizer state {state / _MIB:.1f} MiB, inputs of {batch} samples "
                f"{inputs / _MIB:.1f} MiB, activations of one sample {one / _MIB:.1f} MiB) but its device has "
                f"{memory / _MIB:.1f} MiB; use a smaller --batch or more --ranks (or --no-memory-cap to plan anyway)"
            )
        lo, hi = 1, batch  # saved_bytes grows with b: the largest b in [lo, hi) that fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cost.saved_bytes(stage.layers, mid) <= room else (lo, mid)
        caps.append(lo)
    return tuple(caps)


def fits_without_recompute(
    plan: Plan, cost: CostModel, *, state_copies: int = SGD_STATE_COPIES
) -> tuple[bool, ...]:
    """Per stage, whether ``state + saved_bytes(B)`` fits its device: whether the stage may keep all
    ``B`` samples' activations in a flush schedule instead of recomputing."""
    return tuple(
        state_copies * cost.parameter_bytes(stage.layers) + cost.saved_bytes(stage.layers, plan.batch_size)
        <= _device_bytes(plan, cost, k)
        for k, stage in enumerate(plan.stages)
    )


def memory_need(plan: Plan, cost: CostModel, *, state_copies: int = SGD_STATE_COPIES) -> tuple[int, ...]:
    """Per stage, the predicted peak bytes of the memory model (:func:`~pipetrain.plan.memory.stage_memory`):
    parameters and ``state_copies - 1`` more parameter-sized copies (gradients, optimizer state) plus the
    peak of held activations over the plan's schedule (largest over the stage's ranks). Compare with
    :func:`device_memory`.
    """
    extra = state_copies - SGD_STATE_COPIES  # copies beyond plain SGD's parameters and gradients
    return tuple(m.total_bytes + extra * m.weight_bytes for m in stage_memory(plan, cost, optimizer="sgd"))


def overflows(plan: Plan, cost: CostModel) -> list[tuple[int, int, int]]:
    """``(stage, bytes needed, bytes its device has)`` for every stage whose predicted peak
    (:func:`memory_need`) exceeds its smallest device (:func:`device_memory`); empty when the plan fits."""
    needs = zip(memory_need(plan, cost), device_memory(plan, cost), strict=True)
    return [(k, need, have) for k, (need, have) in enumerate(needs) if need > have]
