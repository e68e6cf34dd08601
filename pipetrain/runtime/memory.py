"""Counting the bytes autograd keeps for backward (saved activations), per rank.

Every tensor autograd saves during a forward passes through a ``saved_tensors_hooks`` pack hook;
we note its storage. A storage is counted once however many saved tensors view it, and stays
counted until the backward of every micro-batch that saved it has run. Parameters (which Linear
saves for its input gradient) are not activations and are left out.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager

import torch

__all__ = ["ActivationMeter"]


class ActivationMeter:
    """Live and peak bytes of saved activations.

    Args:
        parameters: tensors never counted (the stage's parameters).
    """

    def __init__(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {p.untyped_storage().data_ptr() for p in parameters}
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._owned: dict[Hashable, set[int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.enabled = True  # the hook costs a Python call per saved tensor: meter one step only

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
