"""``pipetrain probe --model M --calibrate``: the written cluster carries the terms fitted on M's runs."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from pipetrain.calibrate.fit import Calibration
from pipetrain.cli import main
from pipetrain.cluster import Cluster

FITTED = Calibration(0.9, 2.5e-4, ("1f1b m=1", "zbv m=8"), (0.04, 0.03), (0.04, 0.03))


def test_calibrate_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--calibrate", "--out", "/nonexistent-dir/cluster.json"]) != 0
    assert "add --model" in capsys.readouterr().err


def test_calibrated_terms_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cluster.json"
    probed = Cluster.local(2, action_overhead_s=1e-4, shared_speed=(1.0, 0.95))
    with (mock.patch("pipetrain.calibrate.overhead.probe_local_cluster", return_value=probed),
          mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=FITTED) as calibrate):
        assert main(["probe", "--model", "mlp-digits", "--batch", "32", "--calibrate", "--out", str(out)]) == 0
    assert calibrate.call_args.args[3] == 32
    written = Cluster.from_json(out.read_text())
    assert [d.speed for d in written.devices] == [pytest.approx(0.9)] * 2 and written.action_overhead_s == 2.5e-4
    assert written.shared_speed == (1.0, 0.95)
    assert "250 µs per action (calibrated)" in capsys.readouterr().out


def test_a_calibrated_cluster_brings_the_profile_it_was_fitted_against(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibrated speed is relative to the probe's own profile: `plan --cluster` that cluster, or
    `plan` on the cached probe of this machine, prices with that profile instead of measuring another."""
    from pipetrain import api
    from pipetrain.graph.zoo import build_model
    from pipetrain.plan.plan import Plan
    from pipetrain.profile.estimate import estimate_profile
    from pipetrain.profile.table import Profile

    fitted_against = estimate_profile(build_model("mlp-digits"), "cpu", 32)
    out = tmp_path / "cluster.json"
    monkeypatch.setattr(api, "profile_model", lambda *_, **__: fitted_against)
    with (mock.patch("pipetrain.calibrate.overhead.probe_local_cluster", return_value=Cluster.local(2)),
          mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=FITTED)):
        assert main(["probe", "--model", "mlp-digits", "--batch", "32", "--calibrate", "--out", str(out)]) == 0
    assert Profile.load(tmp_path / "cluster.profile.json") == fitted_against

    def refuse(*_: object, **__: object) -> Profile:
        raise AssertionError("profiled again: the calibration holds for its own profile")

    monkeypatch.setattr(api, "profile_model", refuse)
    capsys.readouterr()
    for where, given in (("a", ["--cluster", str(out)]), ("b", [])):  # the file, then the cache `probe` kept
        plan_file = tmp_path / where / "plan.json"
        assert main(["plan", "--model", "mlp-digits", "--batch", "32", "--ranks", "2", "--planner", "balanced", *given,
                     "--out", str(plan_file)]) == 0
        assert "was calibrated against" in capsys.readouterr().err
        assert Profile.load(plan_file.with_suffix(".profile.json")) == fitted_against
        assert Plan.from_json(plan_file.read_text()).prediction is not None


def test_calibration_runs_the_users_optimizer_and_plan_says_when_it_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`probe --calibrate --optimizer adamw` fits on runs training with adamw and records it; a plan
    for another optimizer on that calibration says so in one line, one for adamw does not."""
    from pipetrain import api
    from pipetrain.calibrate.machine import calibrated_optimizer
    from pipetrain.graph.zoo import build_model
    from pipetrain.profile.estimate import estimate_profile

    out = tmp_path / "cluster.json"
    monkeypatch.setattr(api, "profile_model", lambda *_, **__: estimate_profile(build_model("mlp-digits"), "cpu", 32))
    with (mock.patch("pipetrain.calibrate.overhead.probe_local_cluster", return_value=Cluster.local(2)),
          mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=FITTED) as calibrate):
        assert main(["probe", "--model", "mlp-digits", "--batch", "32", "--calibrate", "--optimizer", "adamw",
                     "--out", str(out)]) == 0
    assert calibrate.call_args.kwargs["optimizer"] == "adamw" and calibrated_optimizer(out) == "adamw"
    capsys.readouterr()
    for optimizer, noted in (("sgd", True), ("adamw", False)):
        assert main(["plan", "--model", "mlp-digits", "--batch", "32", "--ranks", "2", "--cluster", str(out),
                     "--optimizer", optimizer, "--out", str(tmp_path / f"{optimizer}.json")]) == 0
        assert ("calibrated on runs training with adamw, not sgd" in capsys.readouterr().err) is noted
    assert main(["probe", "--optimizer", "adam", "--out", str(out)]) == 2
    assert "--optimizer is the optimizer --calibrate's runs train with" in capsys.readouterr().err


def test_plan_calibrates_this_machine_once_and_reuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` for this machine calibrates its probe on the model's runs (training with the plan's
    optimizer) once, keeps it with the profile it was fitted against, and the next plan reuses both;
    --no-calibrate (or PIPETRAIN_CALIBRATE=0) plans on the probe alone."""
    from pipetrain import api
    from pipetrain.graph.zoo import build_model
    from pipetrain.profile.estimate import estimate_profile

    monkeypatch.setenv("PIPETRAIN_CALIBRATE", "1")
    profiled = estimate_profile(build_model("mlp-digits"), "cpu", 32)
    monkeypatch.setattr(api, "profile_model", lambda *_, **__: profiled)
    argv = ["plan", "--model", "mlp-digits", "--batch", "32", "--ranks", "2", "--planner", "balanced",
            "--optimizer", "adam"]
    with mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=FITTED) as calibrate:
        assert main([*argv, "--no-calibrate", "--out", str(tmp_path / "none" / "plan.json")]) == 0
        assert "not calibrated on mlp-digits" in capsys.readouterr().err and calibrate.call_count == 0
        assert main([*argv, "--out", str(tmp_path / "first" / "plan.json")]) == 0
        assert "calibrated this machine on mlp-digits in" in capsys.readouterr().err
        assert calibrate.call_count == 1 and calibrate.call_args.kwargs["optimizer"] == "adam"
        assert main([*argv, "--out", str(tmp_path / "second" / "plan.json")]) == 0
        assert "using the calibration of this machine on mlp-digits" in capsys.readouterr().err
        assert calibrate.call_count == 1
    for run in ("first", "second"):
        cluster = Cluster.load(tmp_path / run / "plan.cluster.json")
        assert cluster.action_overhead_s == 2.5e-4 and cluster.devices[0].speed == pytest.approx(0.9)
    monkeypatch.setenv("PIPETRAIN_CALIBRATE", "0")
    assert main([*argv, "--reprobe", "--out", str(tmp_path / "off" / "plan.json")]) == 0
    assert "not calibrated on mlp-digits" in capsys.readouterr().err


def test_a_model_the_calibration_cannot_run_plans_on_the_probe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPETRAIN_CALIBRATE", "1")
    assert main(["plan", "--model", "mlp-digits", "--batch", "1", "--ranks", "2", "--planner", "balanced",
                 "--out", str(tmp_path / "plan.json")]) == 0
    text = capsys.readouterr().err
    assert "calibrating this machine" in text and "not calibrated: a data-parallel calibration" in text
    assert "not calibrated on mlp-digits" in text  # and how to calibrate it
