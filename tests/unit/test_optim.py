"""Optimizer settings, learning-rate schedules and single-process gradient clipping."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.plan.memory import OPTIMIZER_NAMES, OptimizerName, parameter_copies
from pipetrain.runtime.job.optim import (
    ADAMW_WEIGHT_DECAY,
    LR_SCHEDULES,
    OptimizerSettings,
    build_optimizer,
    clip_grad_norm_global,
    lr_at,
    set_lr,
    start_clip_grad_norm,
)

EXPECTED: dict[OptimizerName, tuple[type[torch.optim.Optimizer], dict[str, float]]] = {
    "sgd": (torch.optim.SGD, {"momentum": 0.0, "weight_decay": 0.0}),
    "sgd-momentum": (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.0}),
    "adam": (torch.optim.Adam, {"weight_decay": 0.0}),
    "adamw": (torch.optim.AdamW, {"weight_decay": ADAMW_WEIGHT_DECAY}),
}


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_each_optimizer_builds_with_its_defaults_and_steps(name: OptimizerName) -> None:
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(OptimizerSettings(name, lr=0.1), model.parameters())
    kind, defaults = EXPECTED[name]
    assert type(optimizer) is kind
    assert optimizer.defaults["lr"] == 0.1
    assert {k: optimizer.defaults[k] for k in defaults} == defaults
    before = model.weight.detach().clone()
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    assert not torch.equal(model.weight, before)


def test_adamw_is_counted_like_adam_and_given_values_win() -> None:
    assert parameter_copies("adamw") == parameter_copies("adam") == 4
    settings = OptimizerSettings("adamw", lr=1e-3, weight_decay=0.1)
    assert build_optimizer(settings, nn.Linear(2, 2).parameters()).defaults["weight_decay"] == 0.1
    assert OptimizerSettings("sgd", momentum=0.5).state_name == "sgd-momentum"
    assert OptimizerSettings("sgd").state_name == "sgd"
    assert OptimizerSettings("sgd-momentum", momentum=0.8).resolved_momentum == 0.8


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(name="rmsprop"), "--optimizer 'rmsprop' is unknown; use one of sgd, sgd-momentum, adam, adamw"),
        (dict(lr=0.0), "--lr 0.0"),
        (dict(name="adam", momentum=0.9), "--momentum applies to sgd and sgd-momentum, not adam"),
        (dict(name="sgd-momentum", momentum=0.0), "or use --optimizer sgd"),
        (dict(momentum=-0.1), "--momentum -0.1"),
        (dict(weight_decay=-1.0), "--weight-decay -1.0"),
    ],
)
def test_bad_optimizer_settings_name_the_flag(settings: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        OptimizerSettings(**settings)  # type: ignore[arg-type]


def test_constant_schedule() -> None:
    assert [lr_at(s, 5, 0.1, "constant") for s in range(5)] == [0.1] * 5


def test_cosine_schedule_decays_from_base_towards_zero() -> None:
    lrs = [lr_at(s, 10, 0.2, "cosine") for s in range(10)]
    assert lrs[0] == 0.2
    assert lrs[5] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.9)))
    assert all(a > b for a, b in itertools.pairwise(lrs))


def test_warmup_cosine_rises_linearly_then_decays() -> None:
    lrs = [lr_at(s, 14, 1.0, "warmup-cosine", warmup_steps=4) for s in range(14)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0  # the first cosine step starts from the base
    assert lrs[9] == pytest.approx(0.5)  # half-way through the 10 decay steps
    assert lrs[13] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.9)))


@pytest.mark.parametrize(
    ("schedule", "warmup", "message"),
    [
        ("linear", 0, "--lr-schedule 'linear' is unknown; use one of constant, cosine, warmup-cosine"),
        ("cosine", 3, "--warmup-steps applies to --lr-schedule warmup-cosine only"),
        ("warmup-cosine", 0, "needs 1 <= --warmup-steps < the 10 steps"),
        ("warmup-cosine", 10, "needs 1 <= --warmup-steps < the 10 steps"),
        ("constant", -1, "--warmup-steps -1"),
    ],
)
def test_bad_schedules_name_the_flag(schedule: str, warmup: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        lr_at(0, 10, 0.1, schedule, warmup)


def test_step_outside_the_run_is_a_bug() -> None:
    assert set(LR_SCHEDULES) == {"constant", "cosine", "warmup-cosine"}
    with pytest.raises(ValueError, match="step 10 is outside the run's 10 steps"):
        lr_at(10, 10, 0.1, "cosine")


def test_set_lr_sets_every_group() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    optimizer = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}], lr=0.1)
    set_lr(optimizer, 0.03)
    assert [g["lr"] for g in optimizer.param_groups] == [0.03, 0.03]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_one_process_clip_equals_torch(max_norm: float) -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model(torch.randn(6, 5)).square().sum().backward()
    params = list(model.parameters())
    reference = [nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(reference, params, strict=True):
        assert p.grad is not None
        r.grad = p.grad.clone()
    torch_norm = float(torch.nn.utils.clip_grad_norm_(reference, max_norm))
    assert (torch_norm > max_norm) == (max_norm < 1)  # the small norm clips, the large one does not
    norm = clip_grad_norm_global(params, max_norm, world=None)
    assert norm == pytest.approx(torch_norm, rel=1e-6)
    for p, r in zip(params, reference, strict=True):
        assert p.grad is not None and r.grad is not None
        torch.testing.assert_close(p.grad, r.grad, atol=1e-6, rtol=0)


def test_clipping_in_two_halves_scales_only_when_finished() -> None:
    """:func:`start_clip_grad_norm` leaves the gradients as they are; ``finish`` clips as the one-call form."""
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    started = start_clip_grad_norm(params, 1.0, world=None)
    assert not started.in_flight  # nothing to reduce
    assert params[0].grad is not None and float(params[0].grad[0]) == 3.0
    assert started.finish() == pytest.approx(5.0)
    for p, g in zip(params, grads, strict=True):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, g / (5.0 + 1e-6))


def test_clip_rejects_a_bad_norm() -> None:
    with pytest.raises(UserError, match=r"--clip-grad-norm 0\.0: give a norm > 0"):
        clip_grad_norm_global([], 0.0, world=None)
