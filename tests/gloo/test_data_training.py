"""Real data through the pipeline (level c): every rank draws the batch of a step itself, and the
pipelined run equals single-process training on the same data.

One launch runs three jobs: ``mlp-digits`` on ``digits`` across an epoch boundary (and learning),
``gpt-tiny`` on ``text`` with Adam, and a small MLP on a user's ``module:callable`` factory that
every spawned rank imports from the working directory.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, reference_train, train_many

from .models import chain_plan, max_param_diff, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DIGITS_STEPS = 50  # 1,437 train samples // 32 = 44 steps per epoch: the run reshuffles once

_FACTORY = """
    import torch
    from torch.utils.data import TensorDataset

    def make():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(60, 8, generator=g)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        return TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])
"""


def test_pipelines_on_real_data_equal_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pt_gloo_data.py").write_text(textwrap.dedent(_FACTORY))
    monkeypatch.chdir(tmp_path)
    digits, gpt, small = build_model("mlp-digits"), build_model("gpt-tiny", blocks=2), mlp_graph()
    cases = [
        (digits, chain_plan(digits, 2, 32, 4, Method.ONE_F_ONE_B),
         TrainConfig(steps=DIGITS_STEPS, data="digits", progress=False, timeout_s=60)),
        (gpt, chain_plan(gpt, 2, 8, 2),
         TrainConfig(steps=3, data="text", optimizer="adam", lr=1e-3, progress=False, timeout_s=60)),
        (small, chain_plan(small, 2, 12, 3),
         TrainConfig(steps=6, data="pt_gloo_data:make", lr=0.05, progress=False, timeout_s=60)),
    ]
    results = train_many([TrainJob(g, p, c, return_state_dict=True) for g, p, c in cases])
    for (graph, plan, config), result in zip(cases, results, strict=True):
        reference = reference_train(graph, plan.batch_size, config)
        assert max_param_diff(result, reference) <= 1e-5, graph.name
        assert result.losses == pytest.approx(reference.losses, abs=1e-5), graph.name
    digits_losses = results[0].losses
    assert sum(digits_losses[-5:]) / 5 < 0.5 * sum(digits_losses[:5]) / 5  # default SGD (lr 0.01) learns
