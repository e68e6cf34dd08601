"""The asynchronous methods' learning-rate rule (pipetrain.runtime.job.lr_rule): each stage's rate
per method, micro-batch count and replication (whatever the optimizer); its report; the `--lr-rule` flag."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from pipetrain.cli import main
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig
from pipetrain.runtime.job.lr_rule import stage_rates
from pipetrain.runtime.job.optim import OptimizerSettings, build_optimizer


def _plan(method: Method, replicas: tuple[int, ...], n_micro: int, vertical_sync: bool = False) -> Plan:
    """A chain of ``len(replicas)`` stages, stage ``k`` on ``replicas[k]`` ranks, ``n_micro`` micro-batches of 2."""
    sizes = equal_sizes(2 * n_micro, n_micro)
    stages, first = [], 0
    for k, r in enumerate(replicas):
        stages.append(StagePlan((f"layer{k}",), tuple(range(first, first + r)), sizes, sizes))
        first += r
    plan = Plan("m", "", 2 * n_micro, Method.ONE_F_ONE_B, tuple(stages))
    return plan if method is Method.ONE_F_ONE_B else plan.run_by(method, vertical_sync)


@pytest.mark.parametrize(("n_micro", "expected"), [(4, 0.25), (8, 0.125), (9, 1 / 9), (1, 1.0)])
@pytest.mark.parametrize("vertical_sync", [False, True])
def test_pipedream_scales_each_step_by_its_share_of_the_batch(n_micro: int, expected: float,
                                                              vertical_sync: bool) -> None:
    rates = stage_rates(_plan(Method.PIPEDREAM, (1, 1), n_micro, vertical_sync), "auto")
    assert rates.scales == pytest.approx((expected, expected))
    assert rates.changed == (n_micro > 1) and rates.rule == "auto"


def test_a_replicated_stage_steps_less_often_on_summed_gradients_at_the_same_rate() -> None:
    """Stage 0 on 2 ranks steps m/2 times per batch, on two micro-batches' gradients summed: at lr/m it
    moves as far per batch as the others (at 2·lr/m, the rule before 2026-11-28, twice as far)."""
    assert stage_rates(_plan(Method.PIPEDREAM, (2, 1, 1), 4), "auto").scales == pytest.approx((1 / 4, 1 / 4, 1 / 4))


@pytest.mark.parametrize("method", [Method.TWO_BW, Method.ONE_F_ONE_B, Method.GPIPE])
def test_methods_that_step_once_per_batch_keep_the_rate(method: Method) -> None:
    rates = stage_rates(_plan(method, (1, 1), 4), "auto")
    assert rates.scales == (1.0, 1.0) and not rates.changed
    assert ("one step late" in rates.reason) == (method is Method.TWO_BW)


def test_rule_none_keeps_the_rate_and_unknown_rules_are_refused() -> None:
    plan = _plan(Method.PIPEDREAM, (1, 1), 4)
    assert stage_rates(plan, "none").scales == (1.0, 1.0)
    with pytest.raises(UserError, match="--lr-rule 'linear' is unknown; use one of auto, none"):
        stage_rates(plan, "linear")
    with pytest.raises(UserError, match="--lr-rule"):
        TrainConfig(lr_rule="sqrt")  # type: ignore[arg-type]
    assert TrainConfig().lr_rule == "auto"  # on by default
    assert TrainConfig(optimizer="adam", lr=1e-2).stage_rates(plan).scales == (0.25, 0.25)


def test_the_report_names_rule_rates_and_how_to_turn_it_off() -> None:
    text = stage_rates(_plan(Method.PIPEDREAM, (1, 1), 4), "auto").describe(3e-3)
    assert text.startswith("learning rate (--lr-rule auto): every stage at 0.003 × 0.25 = 0.00075: pipedream steps "
                           "once per micro-batch (4 per batch")
    assert text.endswith("--lr-rule none keeps 0.003")
    text = stage_rates(_plan(Method.PIPEDREAM, (2, 1, 1), 4), "auto").describe(0.1)
    assert "every stage at 0.1 × 0.25 = 0.025" in text
    assert "--lr-rule none" not in stage_rates(_plan(Method.TWO_BW, (1, 1), 4), "auto").describe(0.1)


def test_sgd_micro_batch_steps_at_the_scaled_rate_move_as_far_as_one_batch_step() -> None:
    """The linear rule's premise, without staleness: m SGD steps of lr/m, each on a micro-batch mean
    gradient taken at the same weights, equal one step of lr on the batch mean."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    batch, micro = nn.Linear(3, 1), nn.Linear(3, 1)
    micro.load_state_dict(batch.state_dict())
    start = {n: p.detach().clone() for n, p in micro.named_parameters()}
    scale = stage_rates(_plan(Method.PIPEDREAM, (1,), 4), "auto").scales[0]
    nn.functional.mse_loss(batch(x), y).backward()
    build_optimizer(OptimizerSettings("sgd", lr=0.1), batch.parameters()).step()
    for xs, ys in zip(x.split(2), y.split(2), strict=True):
        probe = nn.Linear(3, 1)
        probe.load_state_dict(start)
        nn.functional.mse_loss(probe(xs), ys).backward()
        with torch.no_grad():
            for p, g in zip(micro.parameters(), probe.parameters(), strict=True):
                p -= 0.1 * scale * g.grad
    for a, b in zip(batch.parameters(), micro.parameters(), strict=True):
        torch.testing.assert_close(a, b)


class _Launched(Exception):
    """Raised by the stub launcher: training would start here."""


@pytest.fixture
def launches() -> Iterator[mock.MagicMock]:
    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=_Launched) as stub:
        yield stub


@pytest.fixture
def plan_json(tmp_path: Path) -> Path:
    from pipetrain.graph.zoo import build_model

    graph = build_model("mlp-digits")
    half, sizes = len(graph.names) // 2, equal_sizes(16, 4)
    plan = Plan(graph.name, graph.fingerprint(), 16, Method.ONE_F_ONE_B,
                (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes)))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


@pytest.mark.parametrize(("flags", "rule", "printed"), [
    ((), "auto", "learning rate (--lr-rule auto): every stage at 0.003 × 0.25 = 0.00075"),
    (("--lr-rule", "none"), "none", "learning rate (--lr-rule none): every stage at 0.003 × 1 = 0.003"),
])
def test_train_prints_the_rule_and_passes_it_on(plan_json: Path, tmp_path: Path, launches: mock.MagicMock,
                                               capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
                                               rule: str, printed: str) -> None:
    with pytest.raises(_Launched):
        main(["train", "--plan", str(plan_json), "--method", "pipedream", "--optimizer", "adamw", "--lr", "3e-3",
              "--steps", "4", "--out-dir", str(tmp_path / "run"), *flags])
    (jobs,), _ = launches.call_args
    assert jobs[0].config.lr_rule == rule
    assert printed in " ".join(capsys.readouterr().out.split())


def test_config_file_takes_the_rule(plan_json: Path, tmp_path: Path, launches: mock.MagicMock) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(json.dumps({"lr-rule": "none"}))
    with pytest.raises(_Launched):
        main(["train", "--plan", str(plan_json), "--method", "pipedream", "--steps", "4", "--config", str(config),
              "--out-dir", str(tmp_path / "run")])
    (jobs,), _ = launches.call_args
    assert jobs[0].config.lr_rule == "none"
