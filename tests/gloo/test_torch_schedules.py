"""Every torch.distributed.pipelining schedule of the torch baseline computes single-process gradients.

``benchmarks/common/torch_baseline.py`` runs torch's schedules for the Core benchmark; the comparison is fair
only if torch's runs do the same maths. One step of each schedule on 2 gloo ranks (gpt-tiny with
its LM loss, and a small mlp with cross-entropy), the schedules of a model in one launch, against one
unpipelined step: every gradient within 1e-5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipetrain.graph.layer_graph import loss_sum
from pipetrain.graph.zoo import build_model
from pipetrain.runtime.job.data import make_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common.torch_baseline import one_step_grads
from common.torch_schedules import SCHEDULES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

BATCH, N_MICRO, TOL = 8, 4, 1e-5
MODELS: dict[str, dict[str, float]] = {
    "gpt-tiny": {},
    "mlp": {"inputs": 32, "width": 32, "hidden": 48, "classes": 10},
}


def _reference_grads(model: str, overrides: dict[str, float]) -> dict[str, np.ndarray]:
    """One unpipelined step on step 0's synthetic batch: every gradient by layer and name."""
    graph = build_model(model, **overrides)  # type: ignore[arg-type]
    layers = [graph.build_layer(i) for i in range(len(graph))]
    inputs, targets = make_batch(graph, BATCH, 0, 0, "synthetic")
    out = inputs
    for layer in layers:
        out = layer(out)
    (loss_sum(graph.loss, out, targets) / BATCH).backward()
    return {f"{i}.{n}": p.grad.numpy() for i, layer in enumerate(layers) for n, p in layer.named_parameters()
            if p.grad is not None}


# gpt-tiny under every schedule; the mlp (another loss) under one of each kind: one stage per rank,
# looping and V placement. Each model's schedules run one after another in one launch (the ranks start once).
CASES = {"gpt-tiny": tuple(SCHEDULES), "mlp": ("1f1b", "interleaved-zb", "zbv")}


@pytest.mark.parametrize("model", CASES)
def test_one_step_gradients_equal_single_process(model: str) -> None:
    torch.set_num_threads(1)
    status, by_schedule = one_step_grads(model, BATCH, N_MICRO, CASES[model], timeout_s=400, overrides=MODELS[model])
    assert status == "ok", status
    reference = _reference_grads(model, MODELS[model])
    for schedule, grads in by_schedule.items():
        assert grads.keys() == reference.keys(), schedule
        worst = max(float(np.abs(grads[k] - reference[k]).max()) for k in reference)
        assert worst <= TOL, f"{schedule} on {model}: largest gradient difference {worst:.2e}"
