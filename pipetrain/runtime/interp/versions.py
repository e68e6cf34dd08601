"""A stage's weight versions for the asynchronous methods: stashing (PipeDream) and 2BW.

PipeDream's weight stashing (Narayanan et al. 2019, §3.3; docs/algorithms.md §3.5): a micro-batch's backward
must run on the weights its forward ran on, although the stage has stepped in between. PipeDream-2BW
(2021) runs micro-batches on a version one step old. In both, an action names its
version (``1F7[14:16]v5``) and this store serves it; the interpreter's F, B and STEP handlers call
it (:mod:`pipetrain.runtime.interp.executor`), there is no other loop.

Version ``v`` is the stage's weights after ``v`` optimizer steps. The module's own parameters are
the newest weights, which the optimizer updates in place; every version an action still needs is
a detached copy (one tensor per parameter, ``[*p.shape]``). F runs the module on that copy
(``torch.func.functional_call``), so its autograd graph saves the copy, which no step modifies; B's
weight gradients land on the copy and :meth:`WeightVersions.collect` adds them to the module's
``p.grad``, where STEP finds them. A version is dropped once no later F or B of the rank's program
uses it and it is not the newest: the copies held are the versions of the schedule's
:func:`~pipetrain.schedule.versions.validate_versions` (plus the newest's own copy). Buffers
(BatchNorm statistics) are never versioned.

A program starts on a drained pipeline (a run's start, or a resumed run's first segment,
:mod:`pipetrain.schedule.segments`), so its first F runs on the newest weights: the version that F
names is the number of steps taken before the program, and the store starts there. A resumed run
loads the stage's weights after building the store, then :meth:`WeightVersions.reload` copies them
as that version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call

from pipetrain.schedule.action import Action, ActionKind

__all__ = ["WeightVersions"]


class WeightVersions:
    """The versions of one stage's parameters that its program's F and B actions still need.

    Args:
        module: the stage; its parameters are the newest version.
        program: every action the rank runs from now to the run's end (counts each version's uses,
            and its STEPs: :attr:`steps`, the newest version there will be; its first F names the
            newest version, module docstring).
    """

    def __init__(self, module: nn.Module, program: Sequence[Action]) -> None:
        self.module = module
        self.params = dict(module.named_parameters())
        versioned = [a for a in program if a.kind in (ActionKind.F, ActionKind.B) and a.version is not None]
        self.uses = Counter(a.version for a in versioned)
        self.latest = next((a.version for a in versioned if a.kind is ActionKind.F and a.version is not None), 0)
        self.steps = self.latest + sum(a.kind is ActionKind.STEP for a in program)
        self.held: dict[int, dict[str, torch.Tensor]] = {}
        self.peak = 0
        self._snapshot()

    def reload(self) -> None:
        """The stage's weights were loaded (a resumed run): they are the newest version, the only one held."""
        self.held.clear()
        self._snapshot()

    def _snapshot(self) -> None:
        self.held[self.latest] = {name: p.detach().clone().requires_grad_(p.requires_grad)
                                  for name, p in self.params.items()}
        self.peak = max(self.peak, len(self.held))

    def call(self, version: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's output ``[b, *out]`` on input ``x`` ``[b, *in]`` with version ``version``'s weights."""
        try:
            weights = self.held[version]
        except KeyError:
            raise RuntimeError(f"weight version {version} is not held (newest {self.latest}, held "
                               f"{sorted(self.held)}); the schedule's versions were not validated") from None
        out: torch.Tensor = functional_call(self.module, weights, (x,))
        return out

    def used(self, version: int) -> None:
        """One F or B of ``version`` ran; drop the version when nothing later needs it."""
        self.uses[version] -= 1
        if self.uses[version] <= 0 and version != self.latest:
            self.held.pop(version, None)

    def collect(self, version: int) -> None:
        """Move the weight gradients a B left on ``version``'s copy into the module's ``p.grad``."""
        for name, copy in self.held[version].items():
            if copy.grad is None:
                continue
            p = self.params[name]
            p.grad = copy.grad if p.grad is None else p.grad + copy.grad
            copy.grad = None

    def commit(self) -> None:
        """The optimizer stepped: the module's parameters become the next version."""
        if self.uses[self.latest] <= 0:
            self.held.pop(self.latest, None)
        self.latest += 1
        self._snapshot()
