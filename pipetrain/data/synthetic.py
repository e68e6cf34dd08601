"""``synthetic``: random batches drawn from the model's own tensor specs, for timing runs.

Batch ``step`` is drawn with a generator seeded by ``seed * 1_000_003 + step``: first the inputs
``[B, *input.shape]``, then the targets ``[B, *target.shape]``. Float tensors are standard normal,
integer tensors uniform in ``[0, high)``. There are no datasets and no epochs: every step is new
data, and there is nothing to evaluate on (the labels are noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import TensorSpec

__all__ = ["SyntheticBatches", "draw"]

_STEP_STRIDE = 1_000_003


def draw(spec: TensorSpec, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """``[batch_size, *spec.shape]`` of ``spec.torch_dtype``: normal floats, or integers in ``[0, high)``."""
    shape = (batch_size, *spec.shape)
    if spec.torch_dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(spec.torch_dtype)
    if spec.high is None:
        raise UserError(f"integer tensor spec {spec} needs 'high' to draw synthetic data; set TensorSpec.high")
    return torch.randint(0, spec.high, shape, generator=generator, dtype=spec.torch_dtype)


@dataclass(frozen=True)
class SyntheticBatches:
    """Step-indexed synthetic batches (a :class:`~pipetrain.data.loader.BatchSource`).

    Attributes:
        input: per-sample input spec (the model's).
        target: per-sample target spec (the model's).
        batch_size: samples per batch (B).
        seed: data seed.
    """

    input: TensorSpec
    target: TensorSpec
    batch_size: int
    seed: int

    @property
    def steps_per_epoch(self) -> int | None:
        """None: synthetic data has no epochs."""
        return None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs [B, *input.shape], targets [B, *target.shape])`` of step ``step``."""
        generator = torch.Generator().manual_seed(self.seed * _STEP_STRIDE + step)
        return draw(self.input, self.batch_size, generator), draw(self.target, self.batch_size, generator)
