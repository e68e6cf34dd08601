"""One set of measurements per flow: ``plan`` saves the profile and cluster it used beside the plan and
records them, ``simulate --plan`` reuses them; ``plan`` probes this machine once per model and ranks
(stubbed here), as the demo does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
from rich.console import Console

from pipetrain import api
from pipetrain.calibrate import machine
from pipetrain.cli import main
from pipetrain.cluster import Cluster
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan, PlanSources
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.simulate.timeline import Timeline

MODEL = ("--model", "mlp-digits", "--batch", "16")
QUICK = ("--planner", "balanced")  # the probe is under test here, not the default planner


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rank counts this machine was probed for; each probe's cluster has a telltale overhead."""
    probed: list[int] = []

    def probe(n_ranks: int, **_: object) -> Cluster:
        probed.append(n_ranks)
        return Cluster.local(n_ranks, action_overhead_s=7e-4)

    monkeypatch.setattr(machine, "probe_local_cluster", probe)
    return probed


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "given.json"
    estimate_profile(build_model("mlp-digits"), "cpu", 16).save(path)
    return path


def _planned(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> tuple[Plan, str]:
    code, text = run(capsys, "plan", *MODEL, "--ranks", "2", "--method", "1f1b", "--out", str(out), *extra)
    assert code == 0, text
    return Plan.from_json(out.read_text()), text


def _no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> Profile:
        raise AssertionError("profiled again instead of reusing the plan's profile")

    monkeypatch.setattr(api, "profile_model", refuse)


def test_plan_saves_its_measurements_and_simulate_reuses_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = _planned(capsys, tmp_path / "made" / "plan.json", "--estimate", "cpu")
    assert plan.measurements == PlanSources("plan.profile.json", "plan.cluster.json")
    folder = tmp_path / "moved"
    shutil.move(tmp_path / "made", folder)  # the plan finds its files in its own folder
    _no_profiling(monkeypatch)
    code, text = run(capsys, "simulate", "--plan", str(folder / "plan.json"), "--out-dir", str(tmp_path / "sim"))
    assert code == 0, text
    assert "costs: the plan's profile" in text and "plan.cluster.json" in text
    assert plan.prediction is not None
    assert Timeline.load(tmp_path / "sim" / "predicted.json").iteration_s == plan.prediction.iteration_s


def test_train_reuses_them_at_the_plans_precision(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _planned(capsys, tmp_path / "plan.json", "--estimate", "cpu")
    _no_profiling(monkeypatch)

    class Launched(Exception):
        """Training would start here."""

    for precision, reused in (((), True), (("--precision", "bf16"), False)):
        with mock.patch("pipetrain.runtime.train.launch_local", side_effect=Launched), pytest.raises(Launched):
            main(["train", "--plan", str(tmp_path / "plan.json"), "--steps", "2", *precision,
                  "--out-dir", str(tmp_path / "run"), "--overwrite"])
        assert ("costs: the plan's profile" in capsys.readouterr().err) is reused


def test_train_without_a_plan_plans_as_plan_does(
        tmp_path: Path, profile: Path, probes: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "plan", *MODEL, "--ranks", "2", "--profile", str(profile),
                     "--out", str(tmp_path / "p.json"))
    assert code == 0, text
    planned = Plan.from_json((tmp_path / "p.json").read_text())

    class Launched(Exception):
        """Training would start here."""

    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=Launched), pytest.raises(Launched):
        main(["train", *MODEL, "--ranks", "2", "--profile", str(profile), "--steps", "2",
              "--out-dir", str(tmp_path / "run")])
    text = capsys.readouterr().err
    assert probes == [2] and "as probed before" in text  # plan's probe of this machine, cached
    plan = Plan.from_json((tmp_path / "run" / "plan.json").read_text())
    assert plan.measurements == PlanSources("plan.profile.json", "plan.cluster.json")
    assert Cluster.load(tmp_path / "run" / "plan.cluster.json").action_overhead_s == 7e-4
    assert Profile.load(tmp_path / "run" / "plan.profile.json") == Profile.load(profile)
    assert plan.prediction == planned.prediction and plan.stages == planned.stages


def test_train_plans_with_the_planner_it_is_given(
        tmp_path: Path, profile: Path, probes: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "plan", *MODEL, "--ranks", "2", "--profile", str(profile), *QUICK,
                     "--out", str(tmp_path / "p.json"))
    assert code == 0, text
    planned = Plan.from_json((tmp_path / "p.json").read_text())

    class Launched(Exception):
        """Training would start here."""

    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=Launched), pytest.raises(Launched):
        main(["train", *MODEL, "--ranks", "2", "--profile", str(profile), *QUICK, "--steps", "2",
              "--out-dir", str(tmp_path / "run")])
    assert "auto: running" not in capsys.readouterr().err
    plan = Plan.from_json((tmp_path / "run" / "plan.json").read_text())
    assert plan.prediction == planned.prediction and plan.stages == planned.stages


@pytest.mark.parametrize(("argv", "says"), [
    (("--planner", "balanced", "--time-budget", "5"), "--planner balanced chooses --time-budget itself"),
    (("--plan", "p.json", "--planner", "auto"), "--planner says how train plans without --plan"),
    (("--plan", "p.json", "--time-budget", "5"), "drop --time-budget, or drop --plan"),
])
def test_train_checks_its_planner_flags_first(argv: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _no_profiling(monkeypatch)
    code, text = run(capsys, "train", *MODEL, *argv)
    assert code == 2 and says in text


def test_a_plan_takes_no_probe_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _planned(capsys, tmp_path / "plan.json", "--estimate", "cpu")
    code, text = run(capsys, "train", "--plan", str(tmp_path / "plan.json"), "--reprobe")
    assert code == 2 and "--reprobe is for train without --plan" in text


def test_a_given_profile_overrides_the_plans(
        tmp_path: Path, profile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _planned(capsys, tmp_path / "plan.json", "--estimate", "cpu")
    _no_profiling(monkeypatch)
    code, text = run(capsys, "simulate", "--plan", str(tmp_path / "plan.json"), "--profile", str(profile),
                     "--out-dir", str(tmp_path / "sim"))
    assert code == 0, text
    assert f"--profile {profile} instead of the plan's profile" in text


def test_a_missing_recorded_profile_is_measured_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _planned(capsys, tmp_path / "plan.json", "--estimate", "cpu")
    (tmp_path / "plan.profile.json").unlink()
    measured: list[int] = []

    def measure(graph: object, batch: int, **_: object) -> Profile:
        measured.append(batch)
        return estimate_profile(build_model("mlp-digits"), "cpu", batch)

    monkeypatch.setattr(api, "profile_model", measure)
    code, text = run(capsys, "simulate", "--plan", str(tmp_path / "plan.json"), "--out-dir", str(tmp_path / "sim"))
    assert code == 0, text
    assert f"the plan's profile {tmp_path / 'plan.profile.json'} is missing" in text and measured == [16]


def test_plan_probes_this_machine_once_per_model_and_ranks(
        tmp_path: Path, profile: Path, probes: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    plan, text = _planned(capsys, tmp_path / "a.json", "--profile", str(profile))
    assert probes == [2] and "probed this machine" in text
    assert Cluster.load(tmp_path / "a.cluster.json").action_overhead_s == 7e-4  # the probed cluster, saved
    assert plan.measurements == PlanSources("a.profile.json", "a.cluster.json")
    code, text = run(capsys, "plan", *MODEL, *QUICK, "--ranks", "2", "--profile", str(profile),
                     "--out", str(tmp_path / "b"))
    assert code == 0 and probes == [2] and "as probed before" in text and "--reprobe" in text
    code, text = run(capsys, "plan", *MODEL, *QUICK, "--ranks", "3", "--profile", str(profile),
                     "--out", str(tmp_path / "c"))
    assert code == 0 and probes == [2, 3]
    code, text = run(capsys, "plan", *MODEL, *QUICK, "--ranks", "2", "--profile", str(profile), "--reprobe",
                     "--out", str(tmp_path / "d"))
    assert code == 0 and probes == [2, 3, 2]
    code, text = run(capsys, "plan", *MODEL, *QUICK, "--ranks", "2", "--profile", str(profile), "--no-probe",
                     "--out", str(tmp_path / "e.json"))
    assert code == 0 and probes == [2, 3, 2] and "cluster: " not in text
    assert Cluster.load(tmp_path / "e.cluster.json").action_overhead_s != 7e-4


def test_plan_reuses_what_probe_measured_on_the_model(
        tmp_path: Path, profile: Path, probes: list[int], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pipetrain.calibrate import overhead

    monkeypatch.setattr(overhead, "probe_local_cluster", lambda n, **_: Cluster.local(n, action_overhead_s=3e-4))
    code, text = run(capsys, "probe", *MODEL, "--out", str(tmp_path / "probed.json"))
    assert code == 0 and "kept for `pipetrain plan --model mlp-digits --batch 16 --ranks 2`" in text
    _, text = _planned(capsys, tmp_path / "plan.json", "--profile", str(profile))
    assert probes == [] and "as probed before" in text
    assert Cluster.load(tmp_path / "plan.cluster.json").action_overhead_s == 3e-4


def test_the_probe_cache_is_per_model_and_shared_with_the_demo(probes: list[int]) -> None:
    from pipetrain.demo import DemoSettings, _probe

    digits, wider = build_model("mlp-digits"), build_model("mlp", width=16)
    first = machine.probed_cluster(digits, 16, 2)
    assert first.probed_s is not None and machine.probed_cluster(digits, 16, 2).probed_s is None
    assert machine.probed_cluster(wider, 16, 2).path != first.path and probes == [2, 2]
    _probe(digits, DemoSettings(model="mlp-digits", batch=16, ranks=2), Console(file=None, quiet=True),
           estimate_profile(digits, "cpu", 16))
    assert probes == [2, 2]  # the demo read the probe plan made
    assert first.path.parent == machine.cache_dir() and first.path.name.startswith("cluster-mlp-digits-2r-")


def test_the_demo_calibrates_the_probe_as_plan_does(probes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    from pipetrain.calibrate.fit import Calibration
    from pipetrain.demo import DemoSettings, _probe

    monkeypatch.setenv("PIPETRAIN_CALIBRATE", "1")
    digits = build_model("mlp-digits")
    fitted = Calibration(0.8, 4e-4, ("1f1b m=1", "zbv m=8"), (0.04, 0.03), (0.04, 0.03), optimizer="adamw")
    settings, quiet = DemoSettings(model="mlp-digits", batch=16, ranks=2), Console(file=None, quiet=True)
    with mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=fitted) as calibrate:
        for _ in range(2):  # calibrated once, then read back
            cluster = _probe(digits, settings, quiet, estimate_profile(digits, "cpu", 16))
            assert cluster.action_overhead_s == 4e-4 and cluster.devices[0].speed == pytest.approx(0.8)
    assert calibrate.call_count == 1 and probes == [2]
    assert machine.cached_calibration_profile(digits, 16, 2) is not None


def test_plans_without_measurements_still_load_and_with_them_round_trip() -> None:
    plan = Plan.from_json(json.dumps({"model": "m", "batch_size": 2, "method": "1f1b", "stages": [
        {"layers": ["a"], "ranks": [0], "forward_sizes": [1, 1]}]}))
    assert plan.measurements is None and "measurements" not in plan.to_json()
    recorded = Plan.from_json(plan.to_json().replace('"model": "m"', '"measurements": {"cluster": "../c.yaml"}, '
                                                                     '"model": "m"'))
    assert recorded.measurements == PlanSources(None, "../c.yaml")
    assert Plan.from_json(recorded.to_json()) == recorded
    assert json.loads(recorded.to_json())["measurements"] == {"cluster": "../c.yaml"}


def test_the_demo_prices_with_the_profile_a_cached_calibration_holds_for(
        probes: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    from pipetrain.demo import DemoSettings, _profile

    digits = build_model("mlp-digits")
    settings = DemoSettings(model="mlp-digits", batch=16, ranks=2)
    fitted_against = estimate_profile(digits, "cpu", 16)
    assert machine.cached_calibration_profile(digits, 16, 2) is None
    machine.keep_probe(digits, 16, Cluster.local(2, action_overhead_s=3e-4), fitted_against)
    _no_profiling(monkeypatch)
    assert _profile(digits, settings, Console(file=None, quiet=True)) == fitted_against
    machine.probed_cluster(digits, 16, 2, refresh=True)  # probed again: that calibration no longer holds
    assert machine.cached_calibration_profile(digits, 16, 2) is None and probes == [2]
