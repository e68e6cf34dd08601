"""Zoo models through the runtime: token inputs and an LM loss (gpt-tiny), real data (mlp-digits),
and a thin synthetic network under unequal forward and backward micro-batches (UEDP).

Level (c), like ``test_equivalence``: after 3 steps every rank's parameters equal unpipelined
training.
"""

from __future__ import annotations

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, reference_train, train_many

from .models import chain_plan, max_param_diff, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_zoo_models_match_reference() -> None:
    gpt = build_model("gpt-tiny", blocks=2)
    digits = build_model("mlp-digits")
    synthetic = build_model("synthetic", variant=1, n_layers=6, width=0.0625)
    uedp = uneven_plan(synthetic, [(2, 6), (3, 3, 2), (8,)], [(8,), (1, 3, 4), (4, 4)])
    cases = [
        (gpt, chain_plan(gpt, 3, 6, 3, Method.ONE_F_ONE_B), TrainConfig(steps=3, lr=0.05, progress=False)),
        (gpt, chain_plan(gpt, 2, 6, 4), TrainConfig(steps=3, optimizer="adam", lr=1e-3, progress=False)),
        (digits, chain_plan(digits, 4, 32, 5), TrainConfig(steps=3, lr=0.1, data="digits", progress=False)),
        (synthetic, uedp, TrainConfig(steps=3, lr=0.05, progress=False)),
    ]
    results = train_many([TrainJob(g, p, c, return_state_dict=True) for g, p, c in cases])
    for (graph, plan, config), result in zip(cases, results, strict=True):
        reference = reference_train(graph, plan.batch_size, config)
        assert max_param_diff(result, reference) <= 1e-5, graph.name
        assert result.losses == pytest.approx(reference.losses, abs=1e-5)
