"""What a chain stage's forward keeps for its backward: the activations, or only the inputs (recompute).

    keep       F  with autograd saving its tensors: (x, y) = layers(x [b, *in]); keep (x, y) by range
               B  (x, y) of the F of exactly [lo, hi)
    recompute  F  under no_grad: y = layers(x); keep only x, by range (stashed inputs)
               B  x = stashed inputs [lo, hi), re-chunked; (x, y) = layers(x) with autograd (under
                  the autocast F ran in, :mod:`~pipetrain.runtime.interp.precision`), so [lo, hi) need
                  not match any F range

Recompute (activation checkpointing, docs/algorithms.md §2.6) is per stage, as
:meth:`pipetrain.plan.plan.Plan.recomputes` says: a stage the plan (or a planner under memory
pressure) set to recompute, and a stage whose backward partition differs from its forward one, which
cannot back-propagate part of a forward micro-batch's graph, re-run forward per backward micro-batch.
Under a split backward (:class:`~pipetrain.runtime.interp.backward.SplitBackward`) the re-run happens
at B, which records the parameter owners' outputs as F would have; the graph it builds is what W
later uses, so W re-runs nothing. The re-run must compute what the first run did: it draws the
random numbers F drew (dropout masks; F notes the generators' states,
:mod:`pipetrain.runtime.interp.rng_replay`), which needs it to cover exactly F's samples, so a stage
whose backward ranges differ may not hold dropout (checked when the stage is built); and it must
not count twice in the running statistics of its
BatchNorms: it runs on copies of the stage's buffers (:func:`buffers_kept`), so only F updates
them, as without recompute. The meter counts the stashed inputs from F to B, and the
re-run's saved tensors from B until the backward releases them (a fused B at once, a split one at W).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.runtime.interp.context import Range, RankContext
from pipetrain.runtime.interp.rng_replay import RngState
from pipetrain.schedule.action import Action

__all__ = ["KeepActivations", "Recompute", "Run", "buffers_kept"]

Run = Callable[[RankContext, Action, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""Runs the stage on ``x [b, *in]`` for an action: ``(x, y)``, ``x`` as autograd sees it, ``y`` the
output (the last stage: the weighted loss)."""


class KeepActivations:
    """F keeps ``(x, y)`` and the tensors autograd saved; B takes them back (module docstring).

    Attributes:
        saved: per forward range, ``(x, y)``.
    """

    def __init__(self) -> None:
        self.saved: dict[Range, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, ctx: RankContext, a: Action, x: torch.Tensor, run: Run) -> torch.Tensor:
        with ctx.meter.track((a.lo, a.hi)):
            x, y = run(ctx, a, x)
        self.saved[(a.lo, a.hi)] = (x, y)
        return y

    def restore(self, ctx: RankContext, a: Action, run: Run) -> tuple[torch.Tensor, torch.Tensor]:
        key = (a.lo, a.hi)
        if key not in self.saved:
            raise UserError(
                f"{a}: no forward covered exactly [{a.lo}:{a.hi}) (kept: {sorted(self.saved)}); a stage "
                "whose backward ranges differ from its forward ranges must recompute"
            )
        return self.saved.pop(key)

    def held(self) -> dict[str, list[Range]]:
        return {"forwards": sorted(self.saved)} if self.saved else {}

    def clear(self) -> None:
        self.saved.clear()


class Recompute:
    """F keeps only its inputs; B re-runs forward on them with autograd (module docstring).

    Attributes:
        stashed: the input activations kept by range for the re-run.
    """

    def __init__(self) -> None:
        self.stashed = ChunkBuffer("stashed inputs")
        self.states: dict[Range, RngState] = {}

    def forward(self, ctx: RankContext, a: Action, x: torch.Tensor, run: Run) -> torch.Tensor:
        self.states[(a.lo, a.hi)] = RngState.now(x.device)
        with torch.no_grad():
            _, y = run(ctx, a, x)
        self.stashed.put(a.lo, a.hi, x)
        ctx.meter.add(x.nbytes)
        return y

    def restore(self, ctx: RankContext, a: Action, run: Run) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.stashed.take(a.lo, a.hi)
        state = self.states.pop((a.lo, a.hi), None)  # None: a range no F covered exactly (no dropout there)
        replay = nullcontext() if state is None else state.replayed()
        with ctx.meter.track((a.lo, a.hi)), buffers_kept(ctx.module), ctx.precision.autocast(), replay:
            x, y = run(ctx, a, x)
        ctx.meter.add(-x.nbytes)
        return x, y

    def held(self) -> dict[str, list[Range]]:
        return {self.stashed.name: self.stashed.ranges()} if len(self.stashed) else {}

    def clear(self) -> None:
        self.stashed.clear()
        self.states.clear()


@contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """Run with copies of ``module``'s buffers (BatchNorm's running statistics, its batch count) in
    their place, then put the originals back: a re-run forward must not update them a second time
    (module docstring). The copies are swapped, not written back, since the re-run's autograd graph
    saved them for its backward."""
    owned = [(owner, name, buffer) for owner in module.modules()
             for name, buffer in owner.named_buffers(recurse=False)]
    for owner, name, buffer in owned:
        setattr(owner, name, buffer.clone())
    try:
        yield
    finally:
        for owner, name, buffer in owned:
            setattr(owner, name, buffer)
