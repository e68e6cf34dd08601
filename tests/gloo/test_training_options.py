"""Optimizers, learning-rate schedules and global-norm clipping through the pipeline (level c): every
rank's parameters equal single-process training with the same settings, on a chain, a replicated
stage and unequal micro-batches, with clipping that does clip (a small max norm)."""

from __future__ import annotations

import pytest

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, reference_train, train_many

from .models import chain_plan, max_param_diff, replicated_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _config(**settings: object) -> TrainConfig:
    return TrainConfig(steps=8, data="digits", progress=False, timeout_s=60, **settings)  # type: ignore[arg-type]


def test_optimizers_schedules_and_clipping_equal_single_process() -> None:
    digits = build_model("mlp-digits")
    cases = [
        (chain_plan(digits, 2, 32, 4, Method.ONE_F_ONE_B),
         _config(optimizer="adamw", lr=3e-3, lr_schedule="warmup-cosine", lr_warmup_steps=3,
                 clip_grad_norm=0.5)),
        (replicated_plan(digits, [1, 2], 32, 4),
         _config(optimizer="sgd-momentum", lr=0.05, lr_schedule="cosine", clip_grad_norm=0.3,
                 weight_decay=1e-3)),
        (uneven_plan(digits, [(5, 27), (10, 12, 10)]),
         _config(optimizer="adam", lr=1e-3, clip_grad_norm=0.2)),
    ]
    results = train_many([TrainJob(digits, plan, config, return_state_dict=True) for plan, config in cases])
    for (plan, config), result in zip(cases, results, strict=True):
        reference = reference_train(digits, plan.batch_size, config)
        assert max_param_diff(result, reference) <= 1e-5, config.optimizer
        assert [m.lr for m in result.metrics] == pytest.approx([m.lr for m in reference.metrics], rel=1e-12)
    warm = [m.lr for m in results[0].metrics]
    assert warm[0] == pytest.approx(1e-3) and max(warm) == pytest.approx(3e-3) and warm[-1] < warm[3]
