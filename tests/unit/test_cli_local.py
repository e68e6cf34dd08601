"""The CLI's local-learning options: `plan|simulate|train --method local [--aux ...] [--queue-depth N]`.

Plans use profiles estimated for a V100 (fast, no timing on this machine); training is never
launched: ``launch_local`` is a stub that records the jobs and stops, as in test_cli_properties.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from pipetrain.cli import main
from pipetrain.plan.methods import LocalParams, Method
from pipetrain.plan.plan import Plan

V100 = ("--estimate", "v100")


class _Launched(Exception):
    """Raised by the stub launcher: training would start here."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def one_error_line(text: str) -> str:
    """The error line of a failed command, checked to be the only line it printed."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    return lines[0]


def plan_file(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> tuple[dict[str, object], str]:
    """`plan` for mlp-digits on 2 estimated V100s: the plan JSON written and what was printed."""
    code, text = run(capsys, "plan", "--model", "mlp-digits", "--batch", "16", "--ranks", "2", *V100,
                     "--out", str(out), *extra)
    assert code == 0, text
    data: dict[str, object] = json.loads(out.read_text())
    return data, text


@pytest.fixture
def backprop_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "1f1b.json"
    plan_file(capsys, out, "--method", "1f1b", "--micro", "4")
    return out


@pytest.fixture
def launches() -> Iterator[mock.MagicMock]:
    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=_Launched) as stub:
        yield stub


def test_plan_local_writes_aux_and_queue_depth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, text = plan_file(capsys, tmp_path / "plan.json", "--method", "local", "--aux", "dgl", "--queue-depth", "3")
    assert (data["method"], data["weights"]) == ("local", "local")
    assert (data["params"]["aux"], data["params"]["queue_depth"]) == ("dgl", 3)
    assert "stages balanced with their heads" in text
    plan = Plan.from_json((tmp_path / "plan.json").read_text())
    assert plan.method is Method.LOCAL and plan.prediction is not None and plan.prediction.iteration_s > 0


def test_plan_local_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, _ = plan_file(capsys, tmp_path / "plan.json", "--method", "local", "--stages", "2", "--micro", "4")
    # vectors between MLP stages: a linear head
    assert (data["params"]["aux"], data["params"]["queue_depth"]) == ("linear", 2)


@pytest.mark.parametrize(("argv", "message"), [
    (["--aux", "dgl"], "--aux and --queue-depth are for local learning (no --method given): add --method local"),
    (["--method", "gpipe", "--queue-depth", "3"], "add --method local or drop them"),
    (["--method", "pipedream", "--aux", "linear"], "add --method local or drop them"),
    (["--method", "local", "--planner", "pipedream"], "does not take --planner; drop it"),
    (["--method", "local", "--vertical-sync"], "does not take --vertical-sync; drop it"),
])
def test_plan_refuses_local_options_out_of_place(argv: list[str], message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "plan", "--model", "mlp-digits", "--batch", "16", *V100,
                     "--out", str(tmp_path / "p.json"), *argv)
    assert code == 2 and message in one_error_line(text)
    assert not (tmp_path / "p.json").exists()


def test_plan_local_for_a_language_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-tiny's heads predict every position's next token from the stage's tokens [T, D]."""
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "8", *V100, "--method", "local",
                     "--out", str(tmp_path / "p.json"))
    assert code == 0, text
    plan = Plan.from_json((tmp_path / "p.json").read_text())
    assert plan.params == LocalParams("dgl") and plan.prediction is not None


@pytest.mark.parametrize("argv", [["--aux", "mlp"], ["--queue-depth", "0"], ["--queue-depth", "two"]])
@pytest.mark.parametrize("command", ["plan", "simulate", "train"])
def test_argument_values_are_checked(command: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--method", "local", "--plan", "p.json", *argv] if command != "plan" else
             [command, "--method", "local", *argv])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ("--aux" in error or "--queue-depth" in error) and "error:" in error, error


def test_simulate_runs_a_plans_stages_locally(backprop_plan: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    sim = tmp_path / "sim"
    code, text = run(capsys, "simulate", "--plan", str(backprop_plan), *V100, "--out-dir", str(sim),
                     "--method", "local", "--aux", "infopro", "--queue-depth", "1")
    assert code == 0, text
    assert "local, run as a stream of batches through bounded queues, steady state" in text.replace("\n", " ")
    assert (sim / "predicted.json").stat().st_size > 0
    code, text = run(capsys, "simulate", "--plan", str(backprop_plan), *V100, "--out-dir", str(sim), "--aux", "dgl")
    assert code == 2 and "add --method local or drop them" in one_error_line(text)


def test_simulate_a_local_plan_and_change_its_depth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "local.json"
    plan_file(capsys, plan, "--method", "local", "--micro", "4")
    code, text = run(capsys, "simulate", "--plan", str(plan), *V100, "--out-dir", str(tmp_path / "sim"),
                     "--queue-depth", "5")
    assert code == 0 and "steady state" in text, text
    code, text = run(capsys, "simulate", "--plan", str(plan), *V100, "--out-dir", str(tmp_path / "sim"),
                     "--method", "pipedream")
    assert code == 0 and "pipedream runs batches without a flush" in text.replace("\n", " "), text


def test_train_runs_a_plans_stages_locally(backprop_plan: Path, tmp_path: Path, launches: mock.MagicMock,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(_Launched):
        main(["train", "--plan", str(backprop_plan), "--method", "local", "--aux", "dgl", "--queue-depth", "3",
              "--steps", "4", "--out-dir", str(tmp_path / "run")])
    (jobs,), _ = launches.call_args
    plan = jobs[0].plan
    assert (plan.method, plan.params) == (Method.LOCAL, LocalParams("dgl", 3))
    capsys.readouterr()  # the launched run's lines
    code, text = run(capsys, "train", "--plan", str(backprop_plan), "--queue-depth", "3", "--steps", "4",
                     "--out-dir", str(tmp_path / "run"))
    assert code == 2 and "add --method local or drop them" in one_error_line(text)
