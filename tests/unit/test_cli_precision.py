"""``--precision`` on ``pipetrain plan`` (written to the plan JSON when mixed) and ``pipetrain train``
(overrides the plan's, with a note; reported skipped steps), without launching ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pipetrain.runtime
from pipetrain.cli import main
from pipetrain.cli.run import _summarise_training
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.profile.precision import PRECISIONS
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.runtime import TrainConfig, TrainResult
from pipetrain.runtime.job.config import StepMetrics
from pipetrain.simulate.timeline import Timeline


@pytest.fixture
def tiny_profile(tmp_path: Path) -> Path:
    """A synthetic profile of gpt-tiny (fp32), and beside it the same at each mixed precision
    (``profile-bf16.json``...): a plan at a precision is costed with a profile at it."""
    graph = build_model("gpt-tiny")
    layers = tuple(LayerProfile(name, (1, 32), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6)
                   for name in graph.names)
    path = tmp_path / "profile.json"
    Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers).save(path)
    for precision in PRECISIONS[1:]:
        Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers,
                precision=precision).save(_at(path, precision))
    return path


def _at(profile: Path, precision: str) -> Path:
    """The fixture's profile at ``precision``."""
    return profile if precision == "fp32" else profile.with_name(f"profile-{precision}.json")


def _plan(tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    """Plan with the profile at the ``--precision`` of ``extra`` (default fp32)."""
    profile = _at(profile, extra[extra.index("--precision") + 1] if "--precision" in extra else "fp32")
    out = tmp_path / "plan.json"
    code = main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(profile),
                 "--method", "1f1b", "--out", str(out), *extra])
    assert code == 0, capsys.readouterr().err
    data: dict[str, object] = json.loads(out.read_text())
    return data


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_plan_writes_a_mixed_precision(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str],
                                       precision: str) -> None:
    data = _plan(tmp_path, tiny_profile, capsys, "--precision", precision)
    assert data["precision"] == precision
    assert Plan.from_json(json.dumps(data)).precision == precision


def test_plan_leaves_fp32_out(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "precision" not in _plan(tmp_path, tiny_profile, capsys)
    assert "precision" not in _plan(tmp_path, tiny_profile, capsys, "--precision", "fp32")


def test_plan_refuses_a_profile_at_another_precision(tmp_path: Path, tiny_profile: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(tiny_profile),
                 "--precision", "bf16", "--out", str(tmp_path / "plan.json")]) == UserError.exit_code
    assert "is at fp32 but the plan is at bf16" in capsys.readouterr().err


def test_plan_rejects_an_unknown_precision(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--model", "gpt-tiny", "--precision", "fp8"])
    assert "fp32" in capsys.readouterr().err


class _Launched(UserError):
    """Stands in for the launch: carries the plan ``train`` was called with."""

    def __init__(self, plan: Plan) -> None:
        super().__init__("not launched")
        self.plan = plan


def _train_plan(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], out: Path,
                *argv: str) -> tuple[Plan, str]:
    seen: list[Plan] = []

    def fake_train(graph: object, plan: Plan, config: TrainConfig, **_: object) -> TrainResult:
        seen.append(plan)
        raise _Launched(plan)

    monkeypatch.setattr(pipetrain.runtime, "train", fake_train)
    main(["train", *argv, "--steps", "2", "--out-dir", str(out)])
    return seen[0], capsys.readouterr().out


def test_train_overrides_the_plan_precision(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _plan(tmp_path, tiny_profile, capsys, "--precision", "bf16")
    path = str(tmp_path / "plan.json")
    plan, printed = _train_plan(monkeypatch, capsys, tmp_path / "run", "--plan", path, "--precision", "fp16")
    assert plan.precision == "fp16" and "training at fp16, not the plan's bf16" in printed
    plan, printed = _train_plan(monkeypatch, capsys, tmp_path / "run", "--plan", path)
    assert plan.precision == "bf16" and "training at" not in printed
    plan, printed = _train_plan(monkeypatch, capsys, tmp_path / "run", "--plan", path, "--precision", "bf16")
    assert plan.precision == "bf16" and "training at" not in printed


def test_train_model_without_plan_uses_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan, printed = _train_plan(monkeypatch, capsys, tmp_path / "run", "--model", "mlp-digits", "--estimate", "v100",
                                "--precision", "bf16")
    assert plan.precision == "bf16" and "training at" not in printed


def test_summary_reports_skipped_steps(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan.from_json(json.dumps({**_plan(tmp_path, tiny_profile, capsys), "precision": "fp16"}))
    metrics = tuple(StepMetrics(k, 16 * (k + 1), 0.1 * k, 0.01, 1.0, skipped=k == 1,
                                loss_scale=2.0**16 if k == 0 else 2.0**15) for k in range(3))
    timeline = Timeline((), 2, "measured", (0, 0), "test", (0.1, 0.1))
    result = TrainResult((1.0, 1.0, 1.0), (0.1, 0.1, 0.1), 160.0, timeline, metrics=metrics,
                         data_wait_s=(0.0, 0.0, 0.0))
    _summarise_training(plan, result)
    assert "fp16: 1 of 3 steps skipped on every stage (gradient overflow: steps 1), loss scale now 32768" \
        in capsys.readouterr().out
