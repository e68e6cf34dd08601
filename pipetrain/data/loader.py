"""Step-indexed mini-batches: batch ``step`` is a pure function of (dataset, batch size, seed, step).

Every rank computes the batch of a step itself, so no data is sent, and the sampler's position in a
checkpoint is just the step: resuming at step ``k`` draws exactly what an unbroken run would.

For a train set of ``N`` samples and batch ``B``, an epoch is ``N // B`` steps (the last partial
batch is dropped). Step ``s`` is batch ``s % (N // B)`` of epoch ``s // (N // B)``, whose order is a
permutation seeded by ``(seed, epoch)``; :class:`EpochSampler` is that order as a torch ``Sampler``,
so ``DataLoader(dataset, B, sampler=EpochSampler(N, seed, epoch), drop_last=True)`` yields the same
batches, in the same order, as :meth:`StepLoader.batch` over the steps of that epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, TensorDataset, default_collate

from pipetrain.data.pair import Sample
from pipetrain.errors import UserError

__all__ = ["BatchSource", "EpochSampler", "StepLoader", "epoch_order", "eval_batches", "gather"]

Batch = tuple[torch.Tensor, torch.Tensor]
"""``(inputs [B, *input.shape], targets [B, *target.shape])``."""


class BatchSource(Protocol):
    """Anything that gives the training batch of a step (:class:`StepLoader`, synthetic batches)."""

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps per pass over the train set; None when the data has no epochs."""
        ...

    def batch(self, step: int) -> Batch:
        """``(inputs [B, ...], targets [B, ...])`` of optimizer step ``step``."""
        ...


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """``[n]`` int64: the order of the samples in epoch ``epoch`` (a permutation seeded by both)."""
    rng = np.random.default_rng([seed % 2**64, epoch])
    return torch.from_numpy(rng.permutation(n))


class EpochSampler(Sampler[int]):
    """The sample order of one epoch, as a torch ``Sampler`` (``set_epoch`` moves to another)."""

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_order(self.n, self.seed, self.epoch).tolist())

    def __len__(self) -> int:
        return self.n


def gather(dataset: Dataset[Sample], rows: torch.Tensor) -> Batch:
    """The samples ``rows`` ([B] int64) of ``dataset`` stacked into a batch.

    A ``TensorDataset`` is indexed directly (one copy per tensor); any other dataset is read item by
    item (``__getitems__`` when it has one) and stacked with torch's ``default_collate``.
    """
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors
        return x[rows], y[rows]
    index = rows.tolist()
    getitems = getattr(dataset, "__getitems__", None)
    items = getitems(index) if getitems is not None else [dataset[i] for i in index]
    x, y = default_collate(items)
    return x, y


class StepLoader:
    """Shuffled, step-indexed batches of a map-style dataset (a :class:`BatchSource`).

    Args:
        dataset: yields ``(input, target)`` tensors; ``len(dataset) >= batch_size``.
        batch_size: samples per batch (B).
        seed: shuffling seed.

    Raises:
        UserError: a batch larger than the dataset.
    """

    def __init__(self, dataset: Dataset[Sample], batch_size: int, seed: int, *, name: str = "the data") -> None:
        n = len(dataset)  # type: ignore[arg-type]
        if not 1 <= batch_size <= n:
            raise UserError(f"batch size {batch_size} does not fit {name}'s {n} training samples; use 1 to {n}")
        self.dataset, self.batch_size, self.seed, self.n = dataset, batch_size, seed, n
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.int64)

    @property
    def steps_per_epoch(self) -> int:
        """``N // B``: full batches per epoch."""
        return self.n // self.batch_size

    def rows(self, step: int) -> torch.Tensor:
        """``[B]`` int64: the dataset indices of step ``step``'s batch."""
        if step < 0:
            raise UserError(f"step {step} is negative; steps count from 0")
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:  # a cache of the current epoch's order; results do not depend on it
            self._epoch, self._order = epoch, epoch_order(self.n, self.seed, epoch)
        return self._order[index * self.batch_size:(index + 1) * self.batch_size]

    def batch(self, step: int) -> Batch:
        """``(inputs [B, *input.shape], targets [B, *target.shape])`` of step ``step``."""
        return gather(self.dataset, self.rows(step))


def eval_batches(dataset: Dataset[Sample], batch_size: int) -> Iterator[Batch]:
    """The whole of ``dataset`` in order, ``batch_size`` samples at a time (the last batch may be smaller)."""
    n = len(dataset)  # type: ignore[arg-type]
    for lo in range(0, n, batch_size):
        yield gather(dataset, torch.arange(lo, min(lo + batch_size, n)))
