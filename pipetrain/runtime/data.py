"""Deterministic mini-batches: every rank computes the same batch itself, so no data is sent.

Stage 0 uses the inputs and the last stage the targets; the unpipelined reference uses both. A
batch depends only on ``(graph, batch_size, step, seed, source)``:

* ``"synthetic"``: drawn from the graph's input and target specs with a generator seeded by
  ``(seed, step)``; floats are standard normal, integers uniform in ``[0, high)``.
* ``"digits"``: scikit-learn's bundled 8×8 digits (1,797 samples, 64 features standardised per
  feature, 10 classes), shuffled once per epoch with a seeded permutation; the last partial batch of
  an epoch is dropped.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import torch

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec

__all__ = ["DataSource", "make_batch"]

DataSource = Literal["synthetic", "digits"]

_DIGITS_FEATURES = 64
_DIGITS_CLASSES = 10


def make_batch(
    graph: LayerGraph, batch_size: int, step: int, seed: int, source: DataSource
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mini-batch of optimizer step ``step``.

    Returns:
        ``(inputs [B, *graph.input.shape], targets [B, *graph.target.shape])`` on the CPU.

    Raises:
        UserError: unknown source, or a model whose shapes do not fit the data.
    """
    if source == "synthetic":
        return _synthetic(graph, batch_size, step, seed)
    if source == "digits":
        return _digits(graph, batch_size, step, seed)
    raise UserError(f"unknown data source {source!r}; use 'synthetic' or 'digits'")


def _draw(spec: TensorSpec, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    shape = (batch_size, *spec.shape)
    if spec.torch_dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(spec.torch_dtype)
    if spec.high is None:
        raise UserError(f"integer tensor spec {spec} needs 'high' to draw synthetic data")
    return torch.randint(0, spec.high, shape, generator=generator, dtype=spec.torch_dtype)


def _synthetic(
    graph: LayerGraph, batch_size: int, step: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return _draw(graph.input, batch_size, generator), _draw(graph.target, batch_size, generator)


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(features [1797, 64] float32 standardised, labels [1797] int64)``."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = np.asarray(data.data, dtype=np.float64)
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return x.astype(np.float32), np.asarray(data.target, dtype=np.int64)


def _digits(
    graph: LayerGraph, batch_size: int, step: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if graph.input.shape != (_DIGITS_FEATURES,) or graph.target.shape != ():
        raise UserError(
            f"the digits data has {_DIGITS_FEATURES} features and one class label per sample, but "
            f"model {graph.name!r} takes inputs {graph.input.shape} and targets "
            f"{graph.target.shape}; use a model such as 'mlp-digits' or the synthetic data"
        )
    x, y = _digits_arrays()
    per_epoch = len(x) // batch_size
    if per_epoch == 0:
        raise UserError(f"batch size {batch_size} exceeds the {len(x)} digits samples; use a smaller batch")
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(len(x))
    rows = order[index * batch_size:(index + 1) * batch_size]
    return torch.from_numpy(x[rows]), torch.from_numpy(y[rows])
