"""Which weights a chain stage's actions run on, and what a step boundary means for them.

    current    F and B run the module's own weights. A batch ends in a flush: STEP finds nothing
               left over, and the job waits for the posted sends after it (the optimizer step
               overlaps their transfer); a new batch starts from nothing.
    versioned  F and B run on the version their action names (``1F7[14:16]v5``), B hands its weight
               gradients to the module (:class:`~pipetrain.runtime.interp.versions.WeightVersions`),
               STEP commits a new version. Micro-batches stay in flight across steps, so a new batch
               keeps what earlier forwards kept, and STEP neither waits for the sends (a gradient
               sent now is received in the peer's next chunk; the job waits at the next step, after
               its barrier and the posting of that step's receives) nor checks for leftovers.

Asynchronous methods (``pipedream``, ``2bw``; no flush in their method record) are versioned: their
program spans the run and runs one batch's chunk per step
(:func:`~pipetrain.schedule.versions.batch_chunks`), so the ranges index the run
(:attr:`~pipetrain.runtime.interp.context.LossTally.offset`).

Clipping under ``2bw`` (docs/algorithms.md §3.5) clips batch ``t``'s gradient by its norm over every
stage, but stage 0 reaches its STEP for batch ``t`` one chunk after the last stage: a blocking
all-reduce at STEP would wait across the barrier between chunks for ever. So a STEP whose norm is in
flight (:attr:`~pipetrain.runtime.interp.step.OptimizerStep.waits`) is left *pending*, and the stage
finishes it (waits for the norm, clips, steps, commits version ``t + 1``) when something needs it:
before an F on a version not yet committed (batch ``t + 2``'s) and before the next STEP. Meanwhile
the backwards of batch ``t + 1`` run on version ``t``, the newest committed, and leave their weight
gradients summing on that version's copy, apart from batch ``t``'s; they join the module's once the
step is done. 2BW's warm-up is shorter than a batch, so every rank meets these needs only after its
own STEP of batch ``t``, and the stages that step later are not waited for before they can.

The rank's last STEP, its last action, finishes at once, so the run's end, its final evaluation and
its last checkpoint find every step done. An evaluation between steps runs each stage's committed
weights, without its pending step. Without clipping (or under ``pipedream``, whose norm is its
stage's own) no step waits and each finishes at its STEP.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipetrain.runtime.interp.step import OptimizerStep
from pipetrain.runtime.interp.transport import Transport
from pipetrain.runtime.interp.versions import WeightVersions
from pipetrain.schedule.action import Action

__all__ = ["CurrentWeights", "VersionedWeights"]


class CurrentWeights:
    """Every action runs the module's own weights (module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def call(self, a: Action, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.module(x)
        return y

    def used(self, a: Action) -> None:
        """Nothing to count: there is one version."""

    def backward_done(self, a: Action) -> None:
        """The gradients are already on the module's parameters."""

    def new_batch(self, forget: Callable[[], None]) -> None:
        forget()

    def before_step(self, transport: Transport) -> None:
        """Nothing to wait for: the sends carry activations and input gradients, which the step does not
        touch, and the job waits for them once the step's program is done (:mod:`pipetrain.runtime.job.loop`)."""

    def after_step(self, a: Action, step: OptimizerStep, check: Callable[[Action], None]) -> None:
        step.finish()
        check(a)


class VersionedWeights:
    """F and B on the versions their actions name (module docstring)."""

    def __init__(self, versions: WeightVersions) -> None:
        self.versions = versions
        self.pending: OptimizerStep | None = None
        self.uncollected: set[int] = set()  # versions whose copies hold weight gradients while a step is pending

    def call(self, a: Action, x: torch.Tensor) -> torch.Tensor:
        if a.version is not None and a.version > self.versions.latest:
            self.settle()
        if a.version is None:
            y: torch.Tensor = self.versions.module(x)
            return y
        return self.versions.call(a.version, x)

    def used(self, a: Action) -> None:
        if a.version is not None:
            self.versions.used(a.version)

    def backward_done(self, a: Action) -> None:
        """Move B's weight gradients to the module (on the newest version's copy while a step is
        pending: they join after it); the version's B has run."""
        if a.version is None:
            return
        if self.pending is not None and a.version == self.versions.latest:
            self.uncollected.add(a.version)  # newest: kept until commit
        else:
            self.settle()
            self.versions.collect(a.version)
        self.versions.used(a.version)

    def new_batch(self, forget: Callable[[], None]) -> None:
        """Keep the micro-batches in flight."""

    def before_step(self, transport: Transport) -> None:
        """The job waits for the sends at the next step's start; a pending step finishes first."""
        self.settle()

    def after_step(self, a: Action, step: OptimizerStep, check: Callable[[Action], None]) -> None:
        """Finish the step and commit its version, unless its norm is in flight and a later STEP
        of the rank can finish it (module docstring)."""
        self.pending = step
        if not step.waits or self.versions.latest + 1 == self.versions.steps:
            self.settle()

    def settle(self) -> None:
        """Finish the pending step, if any, and commit its version."""
        if self.pending is not None:
            step, self.pending = self.pending, None
            step.finish()
            for version in sorted(self.uncollected):
                self.versions.collect(version)
            self.uncollected.clear()
            self.versions.commit()
