"""Level (d): the profiler and the runtime on a CUDA device (NCCL). Adds coverage only."""

from __future__ import annotations

import pytest
import torch

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes

pytestmark = pytest.mark.gpu


def test_profile_on_cuda_is_positive_and_grows() -> None:
    from pipetrain.profile.measure import measure_profile

    profile = measure_profile(build_model("gpt-tiny"), 32, device="cuda", repeats=3)
    for layer in profile.layers:
        assert all(t > 0 for t in layer.forward_s)
        assert layer.forward_at(32) >= 0.5 * layer.forward_at(1)


def test_single_rank_training_on_cuda_matches_reference() -> None:
    from pipetrain.runtime import TrainConfig, reference_train, train

    graph = build_model("mlp-digits")
    sizes = equal_sizes(16, 4)
    plan = Plan(graph.name, "", 16, Method.ONE_F_ONE_B, (StagePlan(graph.names, (0,), sizes, sizes),))
    config = TrainConfig(steps=3, warmup_steps=0, progress=False)
    got = train(graph, plan, config, return_state_dict=True).state_dict
    want = reference_train(graph, 16, config).state_dict
    assert got is not None and want is not None
    for name, value in want.items():
        torch.testing.assert_close(got[name].cpu(), value.cpu(), atol=1e-4, rtol=1e-4)
