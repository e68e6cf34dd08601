"""Checkpoints through the pipeline (level c): 8 steps equal 4 steps + resume 4 bit for bit with the
same plan (gpipe, 1f1b, uedp, a replicated stage; Adam state and data order included); a different
plan reshards and continues; a run whose rank was killed resumes from its last checkpoint; export
writes the module's own state_dict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pipetrain.errors import PipelineFailure
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import FaultInjection, TrainConfig, TrainJob, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint, newest_checkpoint

from .models import chain_plan, max_param_diff, replicated_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _config(tmp: Path, name: str, steps: int, **changes: object) -> TrainConfig:
    base = TrainConfig(steps=steps, data="digits", optimizer="adam", lr=3e-3, progress=False, timeout_s=60,
                       checkpoint_dir=tmp / name, checkpoint_every=2)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_resume_equals_an_unbroken_run(tmp_path: Path) -> None:
    digits = build_model("mlp-digits")
    plans = {"gpipe": chain_plan(digits, 2, 32, 4), "1f1b": chain_plan(digits, 2, 32, 4, Method.ONE_F_ONE_B),
             "uedp": uneven_plan(digits, [(5, 27), (10, 12, 10)]), "replicated": replicated_plan(digits, [1, 2], 32, 4)}
    whole = [TrainJob(digits, p, _config(tmp_path, f"{n}-whole", 8), return_state_dict=True) for n, p in plans.items()]
    first = [TrainJob(digits, p, _config(tmp_path, n, 4)) for n, p in plans.items()]
    unbroken_runs = train_many(whole + first)[: len(plans)]
    second = [TrainJob(digits, p, _config(tmp_path, f"{n}-resumed", 8, resume=tmp_path / n), return_state_dict=True)
              for n, p in plans.items()]
    resharded = TrainJob(digits, chain_plan(digits, 3, 32, 2, Method.ONE_F_ONE_B),
                         _config(tmp_path, "resharded", 8, resume=tmp_path / "gpipe"), return_state_dict=True)
    results = train_many([*second, resharded])
    for job, unbroken, resumed in zip(whole, unbroken_runs, results[: len(plans)], strict=True):
        for name, value in unbroken.state_dict.items():
            assert torch.equal(value, resumed.state_dict[name]), (job.plan.method, name)
        assert [m.step for m in resumed.metrics] == [4, 5, 6, 7]
        assert [m.loss for m in resumed.metrics] == [m.loss for m in unbroken.metrics[4:]]
    assert max_param_diff(results[-1], unbroken_runs[0]) <= 1e-5  # other stages and ranks: resharded


def test_killed_rank_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    """With a cosine schedule over the 8 steps: the killed run and the resumed one share it."""
    digits = build_model("mlp-digits")
    plan = chain_plan(digits, 2, 32, 4, Method.ONE_F_ONE_B)
    with pytest.raises(PipelineFailure):
        train_many([TrainJob(digits, plan, _config(tmp_path, "run", 8, fault=FaultInjection(1, 5, "kill"),
                                                    lr_schedule="cosine"))])
    checkpoint = newest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and checkpoint.step == 4
    unbroken, resumed = train_many([
        TrainJob(digits, plan, _config(tmp_path, "whole", 8, lr_schedule="cosine"), return_state_dict=True),
        TrainJob(digits, plan, _config(tmp_path, "run", 8, resume=tmp_path / "run", lr_schedule="cosine"),
                 return_state_dict=True),
    ])
    for name, value in unbroken.state_dict.items():
        assert torch.equal(value, resumed.state_dict[name]), name
    out = tmp_path / "model.pt"
    _, tensors, _ = export_checkpoint(tmp_path / "run", out)
    module = digits.build_module()
    module.load_state_dict(torch.load(out, weights_only=True), strict=True)
    assert tensors == len(module.state_dict())
    for name, value in module.named_parameters():
        assert torch.equal(value, resumed.state_dict[name]), name
