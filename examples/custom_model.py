"""Your own model and data with pipetrain: a residual MLP on scikit-learn's handwritten digits.

Run from the repository root::

    python examples/custom_model.py

``ResidualMLP`` is an ordinary module, not an ``nn.Sequential``: pipetrain traces it with torch.fx
and cuts it into the layers ``stem``, ``blocks.0`` … ``blocks.3``, ``head`` (each residual add stays
with its block), which the planner then groups into pipeline stages. ``digits_data`` is a data
factory: any zero-argument function returning ``(train, eval)`` map-style Datasets of
``(input, target)`` samples. Both are named as ``module.path:callable``, which is also how the
command line takes them (``--model examples.custom_model:build --data examples.custom_model:digits_data``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

FEATURES, CLASSES, WIDTH, BLOCKS = 64, 10, 128, 4


class Block(nn.Module):
    """``x [b, W]`` → LayerNorm → Linear ``W → 2W`` → GELU → Linear ``2W → W``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    """``x [b, 64]`` → stem → ``BLOCKS`` × ``(x = x + block(x))`` → relu → head → logits ``[b, 10]``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(torch.relu(x))


def build() -> nn.Module:
    """The model, with its initial weights drawn from a fixed seed."""
    torch.manual_seed(0)
    return ResidualMLP()


def digits_data() -> tuple[Dataset[tuple[torch.Tensor, torch.Tensor]], Dataset[tuple[torch.Tensor, torch.Tensor]]]:
    """``(train, eval)``: 1,437 and 360 samples ``(x [64] float32, y [] int64)``, a fixed split,
    features standardised with the train part's mean and standard deviation."""
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(features, dtype=torch.float32), torch.tensor(labels, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, held_out = order[:1437], order[1437:]
    x = (x - x[train].mean(dim=0)) / x[train].std(dim=0).clamp_min(1e-6)
    return TensorDataset(x[train], y[train]), TensorDataset(x[held_out], y[held_out])


def main() -> None:
    """Capture, profile, plan for 2 local ranks, train, and report the held-out accuracy."""
    from pipetrain import api
    from pipetrain.runtime import TrainConfig, train

    data = "examples.custom_model:digits_data"  # every rank imports it by name
    graph = api.resolve_model(build(), data=data, name="residual-mlp")
    print("layers:", ", ".join(graph.names))
    profile = api.profile_model(graph, batch_size=64)
    plan = api.plan(graph, profile, api.local_cluster(2), batch_size=64).plan
    print("stages:", " | ".join(", ".join(stage.layers) for stage in plan.stages))
    result = train(graph, plan, TrainConfig(steps=150, lr=0.05, data=data, eval_every=50))
    last = result.metrics[-1]
    print(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}; held-out accuracy {last.eval_accuracy:.1%}")


if __name__ == "__main__":
    main()
