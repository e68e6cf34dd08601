"""Counting the bytes a rank holds: saved activations, gradients, parameters and optimizer state.

Every tensor autograd saves during a forward passes through a ``saved_tensors_hooks`` pack hook;
we note its storage (and, for a split backward, the output gradients its B keeps for W). A storage
is counted once however many saved tensors view it, and stays counted until the backward of every
micro-batch that saved it has run. Parameters (which Linear
saves for its input gradient) are not activations and are left out. Gradients are noted each time
autograd accumulates into a parameter's ``.grad`` (a post-accumulate hook), so their bytes are
those held at the optimizer step, before the step zeroes them. :func:`measured_memory` adds the
parameters and the optimizer's state tensors; it is what :mod:`pipetrain.simulate.memory` predicts.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from pipetrain.plan.memory import StageMemory

__all__ = ["ActivationMeter", "MeasuredMemory", "measured_memory"]


@dataclass(frozen=True)
class MeasuredMemory(StageMemory):
    """What one rank held at its peak, in bytes: the runtime's counterpart of :class:`StageMemory`
    (gradients at the optimizer step, the optimizer's state tensors after a step, the peak of saved
    activations and stashed inputs over a step), and the rank it was measured on."""

    rank: int


class ActivationMeter:
    """Live and peak bytes of saved activations, and the bytes of the parameters' gradients.

    Args:
        parameters: the stage's parameters: never counted as activations; their gradients are
            counted in :attr:`gradient_bytes`.
    """

    def __init__(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        params = list(parameters)
        self._params = params
        self._excluded = {p.untyped_storage().data_ptr() for p in params}
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._owned: dict[Hashable, set[int]] = {}
        self._grad_bytes: dict[int, int] = {}  # parameter index -> bytes of its .grad storage
        self.live_bytes = 0
        self.peak_bytes = 0
        self.enabled = True  # the hooks cost a Python call per saved tensor and gradient: meter one step only
        for index, p in enumerate(params):
            if p.requires_grad:
                hook = partial(self._note_grad, index)
                p.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]  # torch is unannotated

    @property
    def gradient_bytes(self) -> int:
        """Bytes of the gradients accumulated so far in the metered step (all of them at its STEP)."""
        return sum(self._grad_bytes.values())

    def _note_grad(self, index: int, parameter: torch.Tensor) -> None:
        if self.enabled and parameter.grad is not None:
            self._grad_bytes[index] = parameter.grad.untyped_storage().nbytes()

    def note_gradients(self) -> None:
        """Note every parameter's ``.grad`` as it is now (call at STEP): a split backward's W assigns
        and adds a plain linear's gradients directly, which no accumulate hook sees."""
        for index, p in enumerate(self._params):
            self._note_grad(index, p)

    @contextmanager
    def track(self, key: Hashable) -> Iterator[None]:
        """Count what autograd saves inside the block as held by ``key`` (e.g. a sample range)."""
        if not self.enabled:
            yield
            return
        seen: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in self._excluded:
                seen[ptr] = storage.nbytes()
            return tensor

        def unpack(tensor: torch.Tensor) -> torch.Tensor:
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        self._hold(key, seen)

    def _hold(self, key: Hashable, storages: dict[int, int]) -> None:
        owned = self._owned.setdefault(key, set())
        for ptr, nbytes in storages.items():
            if ptr in owned:
                continue
            owned.add(ptr)
            self._refs[ptr] = self._refs.get(ptr, 0) + 1
            if self._refs[ptr] == 1:
                self._sizes[ptr] = nbytes
                self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def hold(self, key: Hashable, tensors: Iterable[torch.Tensor]) -> None:
        """Count ``tensors`` (each storage once) as held by ``key`` until :meth:`release`: what a split
        backward's B keeps for its W beyond the saved activations (the owners' output gradients)."""
        if self.enabled:
            self._hold(key, {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors})

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` more (negative: fewer) held outside autograd, e.g. stashed inputs."""
        if not self.enabled:
            return
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def release(self, key: Hashable) -> None:
        """The backward of ``key`` has run: its saved tensors are gone."""
        for ptr in self._owned.pop(key, set()):
            self._refs[ptr] -= 1
            if self._refs[ptr] == 0:
                del self._refs[ptr]
                self.live_bytes -= self._sizes.pop(ptr)


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(sizes.values())


def measured_memory(
    rank: int, meter: ActivationMeter, module: nn.Module, optimizer: torch.optim.Optimizer | None
) -> MeasuredMemory:
    """What ``rank`` held, read after its steps: the meter's activation and gradient bytes, the
    module's parameters, and every tensor in the optimizer's state (momentum buffers, Adam's moments
    and step counters)."""
    state = [] if optimizer is None else [
        v for per_param in optimizer.state.values() for v in per_param.values() if isinstance(v, torch.Tensor)
    ]
    return MeasuredMemory(
        rank=rank,
        weight_bytes=_storage_bytes(module.parameters()),
        gradient_bytes=meter.gradient_bytes,
        optimizer_state_bytes=_storage_bytes(state),
        activation_bytes=meter.peak_bytes,
    )
