"""Evaluation through the pipeline (level c): the forward-only programs of the plan give the held-out
loss and accuracy of single-process evaluation, on every kind of plan (unequal sizes, a replicated
last stage), at the steps ``eval_every`` asks for; ``epochs`` and a user's loss callable are honoured.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, reference_train, train_many

from .models import chain_plan, replicated_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

_LOSS = """
    import torch

    def smooth(output, target):
        return torch.nn.functional.cross_entropy(output, target, reduction="sum", label_smoothing=0.1)
"""


def test_pipeline_evaluation_equals_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pt_eval_loss.py").write_text(textwrap.dedent(_LOSS))
    monkeypatch.chdir(tmp_path)
    digits, gpt = build_model("mlp-digits"), build_model("gpt-tiny", blocks=2)
    config = TrainConfig(steps=6, eval_every=3, data="digits", progress=False, timeout_s=60)
    cases = [
        (digits, chain_plan(digits, 2, 32, 4, Method.ONE_F_ONE_B), config),
        (digits, uneven_plan(digits, [(5, 27), (10, 12, 10)]), config),
        (digits, replicated_plan(digits, [1, 2], 32, 4), config),
        (digits, chain_plan(digits, 2, 500, 4),  # two epochs of 2 steps (1,437 // 500)
         TrainConfig(epochs=2, data="digits", loss="pt_eval_loss:smooth", progress=False, timeout_s=60)),
        (gpt, chain_plan(gpt, 2, 64, 2), TrainConfig(steps=2, data="text", progress=False, timeout_s=60)),
    ]
    results = train_many([TrainJob(g, p, c) for g, p, c in cases])
    for (graph, plan, config), result in zip(cases, results, strict=True):
        reference = reference_train(graph, plan.batch_size, config, return_state_dict=False)
        evaluated = [(m.step, m.eval_loss, m.eval_accuracy) for m in result.metrics if m.eval_loss is not None]
        expected = [(m.step, m.eval_loss, m.eval_accuracy) for m in reference.metrics if m.eval_loss is not None]
        assert [e[0] for e in evaluated] == [e[0] for e in expected], plan.stages
        for (_, loss, accuracy), (_, ref_loss, ref_accuracy) in zip(evaluated, expected, strict=True):
            assert loss == pytest.approx(ref_loss, abs=1e-5)
            assert accuracy == pytest.approx(ref_accuracy, abs=1e-9)
        assert result.losses == pytest.approx(reference.losses, abs=1e-5)
    assert [m.step for m in results[0].metrics if m.eval_loss is not None] == [2, 5]
    assert len(results[3].metrics) == 4  # epochs=2 resolved to 2 × (1,437 // 500) steps
    assert results[4].final_eval is not None and results[4].final_eval.eval_accuracy is not None
