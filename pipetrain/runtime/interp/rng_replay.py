"""Replaying a forward's random numbers when a recomputing stage re-runs it.

    state = RngState.now(x.device)          # at F, before the stage runs
    with state.replayed():                  # at B: the re-run draws what F drew (dropout masks)
        y = stage(x)

A recomputing stage (:mod:`pipetrain.runtime.interp.keeping`) runs its forward twice: at F without
autograd, at B with it. A module that draws random numbers (dropout) must draw the same ones both
times, or the gradients are of another function than the one F computed. As torch's activation
checkpointing does (``preserve_rng_state``), F notes the generators' states (the CPU's, and the
CUDA device's the stage runs on) and B's re-run starts from them inside
:func:`torch.random.fork_rng`, which puts the live states back afterwards: the rest of the step draws
as if there had been no re-run. The re-run must cover exactly F's samples; a stage whose backward
ranges differ from its forward ones cannot replay (its draws have other shapes) and is refused when
it holds dropout (:mod:`pipetrain.runtime.interp.rank_setup`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["RngState"]


@dataclass(frozen=True)
class RngState:
    """The random generators' states at one moment.

    Attributes:
        cpu: the CPU generator's state.
        device: the CUDA device whose generator is noted too; None on the CPU.
        device_state: that generator's state.
    """

    cpu: torch.Tensor
    device: torch.device | None = None
    device_state: torch.Tensor | None = None

    @classmethod
    def now(cls, device: torch.device) -> RngState:
        """The states now: the CPU's, and ``device``'s when it is a CUDA device."""
        if device.type != "cuda":
            return cls(torch.get_rng_state())
        return cls(torch.get_rng_state(), device, torch.cuda.get_rng_state(device))

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block from these states; the live states are back afterwards."""
        devices = [] if self.device is None else [self.device]
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.device is not None and self.device_state is not None:
                torch.cuda.set_rng_state(self.device_state, self.device)
            yield
