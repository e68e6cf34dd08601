"""fp16's loss scaler (:mod:`pipetrain.runtime.job.loss_scale`): its update rule as ``torch.amp.GradScaler``
has it, unscaling, the checkpoint state, and the stage precision's autocast and message dtypes
(:mod:`pipetrain.runtime.interp.precision`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.runtime.interp.precision import StagePrecision
from pipetrain.runtime.job.loss_scale import LossScaler, unscale_


def test_overflow_halves_the_scale_and_restarts_the_count() -> None:
    scaler = LossScaler(growth_interval=3)
    scaler.update(False)
    scaler.update(False)
    scaler.update(True)
    assert (scaler.scale, scaler.good_steps, scaler.skipped) == (2.0**15, 0, 1)


def test_scale_doubles_after_growth_interval_good_steps() -> None:
    scaler = LossScaler(scale=8.0, growth_interval=3)
    for _ in range(2):
        scaler.update(False)
    assert scaler.scale == 8.0 and scaler.good_steps == 2
    scaler.update(False)
    assert scaler.scale == 16.0 and scaler.good_steps == 0
    for _ in range(3):
        scaler.update(False)
    assert scaler.scale == 32.0


def test_update_rule_matches_torch_grad_scaler() -> None:
    """The same sequence of overflows gives ``torch.amp.GradScaler``'s scales (on the CPU)."""
    pattern = [False, False, True, False, False, False, True, True, False, False]
    ours = LossScaler(scale=1024.0, growth_interval=2)
    theirs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.0)
    for inf in pattern:
        theirs.scale(torch.ones(()))  # starts its scale tensor, as scaling the loss does
        p.grad = torch.tensor([float("inf") if inf else 1.0, 1.0])
        theirs.step(opt)
        theirs.update()
        ours.update(inf)
        assert ours.scale == theirs.get_scale()


def test_unscale_divides_and_finds_non_finite() -> None:
    a, b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([4.0, 8.0, -2.0])
    assert not unscale_([a, b], 4.0)  # b has no gradient
    assert torch.equal(a.grad, torch.tensor([1.0, 2.0, -0.5]))
    b.grad = torch.tensor([1.0, float("nan")])
    assert unscale_([a, b], 2.0)


def test_state_round_trips_and_rejects_other_fields() -> None:
    scaler = LossScaler(scale=512.0, good_steps=7, skipped=2)
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert again == scaler
    with pytest.raises(UserError, match="resume with the version"):
        again.load_state_dict({"scale": 1.0})


def test_fp32_stage_changes_nothing() -> None:
    fp32 = StagePrecision()
    assert fp32.wire_dtype(torch.float32) is torch.float32 and not fp32.mixed
    with fp32.autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_stage_sends_floats_in_the_compute_dtype(precision: str, dtype: torch.dtype) -> None:
    stage = StagePrecision(precision, "cpu")  # type: ignore[arg-type]
    assert stage.wire_dtype(torch.float32) is dtype
    assert stage.wire_dtype(torch.int64) is torch.int64  # token ids stay integers
    with stage.autocast():
        y = nn.Linear(4, 2)(torch.ones(3, 4))
    assert y.dtype == dtype
