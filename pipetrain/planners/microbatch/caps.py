"""Memory caps: per stage, the largest micro-batch whose activations fit the stage's device.

docs/algorithms.md §2.6 (Memory). A ``uedp`` plan runs in flush (GPipe) order: every forward of a
mini-batch runs before its backwards, so a stage that keeps its autograd activations holds all
``B`` samples' of them at once, whatever its partition: its peak is

    state + saved_bytes(B)                                  (keeps activations)

and the micro-batch size does not change it. A stage that *recomputes* (its backward partition
differs from its forward one, or its ``recompute`` is set; see
:meth:`~pipetrain.plan.plan.Plan.recomputes`) keeps only its inputs during forward and re-runs
forward for each backward micro-batch, holding that micro-batch's activations while it
back-propagates:

    state + input_bytes(B) + saved_bytes(b)                 (recomputes, b: its largest micro-batch)

which is the memory model's too (:mod:`pipetrain.simulate.memory`, shared with the event simulator).
``state`` is :func:`~pipetrain.plan.memory.parameter_copies` times the parameters (weights,
gradients, optimizer state: SGD 2, Adam 4). Only the recompute case has a micro-batch size to cap,
so :func:`microbatch_caps` bounds ``b`` by the second formula; :func:`fits_without_recompute` says
which stages fit the first, i.e. may keep their activations;
:func:`~pipetrain.simulate.memory.memory_need` checks a plan of any method with the memory model.
Activation bytes are the profile's per-sample bytes (:meth:`~pipetrain.cost.CostModel.saved_bytes`),
so allocator slack and workspace are not counted: a cap is an upper bound on what can fit, not a
guarantee."""

from __future__ import annotations

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.memory import OptimizerName, parameter_copies
from pipetrain.plan.plan import Plan
from pipetrain.simulate.memory import device_memory

__all__ = ["fits_without_recompute", "microbatch_caps"]

_MIB = 2**20


def microbatch_caps(plan: Plan, cost: CostModel, *, optimizer: OptimizerName = "sgd") -> tuple[int | None, ...]:
    """Per stage, the largest micro-batch ``b`` with ``state + input_bytes(B) + saved_bytes(b)`` within
    the device's memory; None where every ``b`` up to the batch fits.

    Args:
        plan: the stages (layers, ranks) and batch; its sizes are ignored.
        cost: the profile's bytes and the cluster's :attr:`~pipetrain.cluster.Device.memory_bytes`.
        optimizer: whose state counts (:func:`~pipetrain.plan.memory.parameter_copies`).

    Raises:
        UserError: a stage does not fit even with micro-batches of one sample; names the stage,
            what it needs and what its device has.
    """
    caps: list[int | None] = []
    batch, copies = plan.batch_size, parameter_copies(optimizer)
    for k, (stage, memory) in enumerate(zip(plan.stages, device_memory(plan, cost), strict=True)):
        state, inputs = copies * cost.parameter_bytes(stage.layers), cost.input_bytes(stage.layers, batch)
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
                f"{memory / _MIB:.1f} MiB; use a smaller batch or more devices (or turn the memory cap off to plan "
                "anyway)"
            )
        lo, hi = 1, batch  # saved_bytes grows with b: the largest b in [lo, hi) that fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if cost.saved_bytes(stage.layers, mid) <= room else (lo, mid)
        caps.append(lo)
    return tuple(caps)


def fits_without_recompute(plan: Plan, cost: CostModel, *, optimizer: OptimizerName = "sgd") -> tuple[bool, ...]:
    """Per stage, whether ``state + saved_bytes(B)`` fits its device: whether the stage may keep all
    ``B`` samples' activations in a flush schedule instead of recomputing."""
    copies = parameter_copies(optimizer)
    return tuple(
        copies * cost.parameter_bytes(stage.layers) + cost.saved_bytes(stage.layers, plan.batch_size) <= memory
        for stage, memory in zip(plan.stages, device_memory(plan, cost), strict=True)
    )
