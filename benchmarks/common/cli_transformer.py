"""A user's transformer, as a user would write it, for the CLI-flow benchmark (issue 32, ``bench_cli_flow.py``).

``DigitRows`` reads scikit-learn's handwritten digits as a sequence: each 8×8 image is 8 rows of 8
pixels. ``x [b, 8, 8]`` → Linear ``8 → D`` + a learnt position → a ``ModuleList`` of
``nn.TransformerEncoderLayer`` (batch first) → mean over rows → Linear ``D → 10`` → logits ``[b, 10]``.
Named on the command line as ``--model benchmarks.common.cli_transformer:build --data
benchmarks.common.cli_transformer:digit_rows`` (run from the repository root).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

ROWS, PIXELS, CLASSES = 8, 8, 10
WIDTH, HEADS, LAYERS = 128, 4, 4


class DigitRows(nn.Module):
    """The transformer of the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(PIXELS, WIDTH)
        self.position = nn.Parameter(torch.zeros(1, ROWS, WIDTH))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
            for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.position
        for layer in self.layers:
            h = layer(h)
        logits: torch.Tensor = self.head(h.mean(dim=1))
        return logits


def build() -> nn.Module:
    """The model, its initial weights drawn from a fixed seed."""
    torch.manual_seed(0)
    return DigitRows()


def digit_rows() -> tuple[TensorDataset, TensorDataset]:
    """``(train, eval)``: 1,437 and 360 samples ``(x [8, 8] float32, y [] int64)``, a fixed split,
    pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    x = torch.tensor(features, dtype=torch.float32).reshape(-1, ROWS, PIXELS) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[order[:1437]], y[order[:1437]]), TensorDataset(x[order[1437:]], y[order[1437:]])
