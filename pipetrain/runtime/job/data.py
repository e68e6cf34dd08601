"""Deterministic mini-batches: every rank computes the same batch itself, so no data is sent.

Stage 0 uses the inputs and the last stage the targets; the unpipelined reference uses both. A
batch depends only on ``(graph, batch_size, step, seed, source)``; the sources and the sampling are
:mod:`pipetrain.data`'s:

* ``"synthetic"``: drawn from the graph's input and target specs with a generator seeded by
  ``(seed, step)``; floats are standard normal, integers uniform in ``[0, high)``.
* ``"digits"``, ``"text"`` and ``"module.path:callable"``: the source's *train* dataset, shuffled
  per epoch with a permutation seeded by ``(seed, epoch)``; the last partial batch of an epoch is
  dropped (:class:`~pipetrain.data.loader.StepLoader`).

Each process builds a source's loader once (the datasets are materialised then) and keeps it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from pipetrain.data import BatchSource, train_batches
from pipetrain.graph.layer_graph import LayerGraph

__all__ = ["DataSource", "TimedBatch", "make_batch", "steps_per_epoch", "timed_batch"]

DataSource = str
"""``"digits"``, ``"text"``, ``"synthetic"`` or ``"module.path:callable"`` (see :mod:`pipetrain.data.sources`)."""


@dataclass(frozen=True)
class TimedBatch:
    """A mini-batch and the time it took to get it.

    Attributes:
        inputs: ``[B, *graph.input.shape]`` on the CPU.
        targets: ``[B, *target.shape]`` on the CPU (the model's target spec, or the dataset's).
        wait_s: seconds spent making it (loading the datasets on a process's first batch included).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    wait_s: float


def timed_batch(graph: LayerGraph, batch_size: int, step: int, seed: int, source: DataSource) -> TimedBatch:
    """The mini-batch of optimizer step ``step``, timed.

    Raises:
        UserError: an unknown source, a model whose shapes do not fit the data, or a batch larger
            than the train set.
    """
    start = time.perf_counter()
    inputs, targets = _loader(source, graph, batch_size, seed).batch(step)
    return TimedBatch(inputs, targets, time.perf_counter() - start)


def make_batch(
    graph: LayerGraph, batch_size: int, step: int, seed: int, source: DataSource
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs [B, *graph.input.shape], targets [B, *target.shape])`` of step ``step``, on the CPU.

    Raises:
        UserError: as :func:`timed_batch`.
    """
    batch = timed_batch(graph, batch_size, step, seed, source)
    return batch.inputs, batch.targets


def steps_per_epoch(graph: LayerGraph, batch_size: int, seed: int, source: DataSource) -> int | None:
    """Optimizer steps per pass over the train set (``N // B``); None for data without epochs."""
    return _loader(source, graph, batch_size, seed).steps_per_epoch


@functools.lru_cache(maxsize=8)
def _loader(source: DataSource, graph: LayerGraph, batch_size: int, seed: int) -> BatchSource:
    return train_batches(source, graph, batch_size, seed)
