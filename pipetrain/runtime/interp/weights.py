"""Which weights a chain stage's actions run on, and what a step boundary means for them.

    current    F and B run the module's own weights. A batch ends in a flush: STEP waits for the
               posted sends and finds nothing left over; a new batch starts from nothing.
    versioned  F and B run on the version their action names (``1F7[14:16]v5``), B hands its weight
               gradients to the module (:class:`~pipetrain.runtime.interp.versions.WeightVersions`),
               STEP commits a new version. Micro-batches stay in flight across steps, so a new batch
               keeps what earlier forwards kept, and STEP neither waits for the sends (a gradient
               sent now is received in the peer's next chunk; the job waits at the next step, once
               every rank has posted that step's receives) nor checks for leftovers.

Asynchronous methods (``pipedream``, ``2bw``; no flush in their method record) are versioned: their
program spans the run and runs one batch's chunk per step
(:func:`~pipetrain.schedule.versions.batch_chunks`), so the ranges index the run
(:attr:`~pipetrain.runtime.interp.context.LossTally.offset`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

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
        transport.wait_sends()

    def after_step(self, a: Action, check: Callable[[Action], None]) -> None:
        check(a)


class VersionedWeights:
    """F and B on the versions their actions name (module docstring)."""

    def __init__(self, versions: WeightVersions) -> None:
        self.versions = versions

    def call(self, a: Action, x: torch.Tensor) -> torch.Tensor:
        if a.version is None:
            y: torch.Tensor = self.versions.module(x)
            return y
        return self.versions.call(a.version, x)

    def used(self, a: Action) -> None:
        if a.version is not None:
            self.versions.used(a.version)

    def backward_done(self, a: Action) -> None:
        """Move B's weight gradients to the module; the version's B has run."""
        if a.version is not None:
            self.versions.collect(a.version)
            self.versions.used(a.version)

    def new_batch(self, forget: Callable[[], None]) -> None:
        """Keep the micro-batches in flight."""

    def before_step(self, transport: Transport) -> None:
        """The job waits for the sends at the next step's start."""

    def after_step(self, a: Action, check: Callable[[Action], None]) -> None:
        self.versions.commit()
