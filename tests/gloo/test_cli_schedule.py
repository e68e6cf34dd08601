"""`pipetrain simulate --schedule` and `pipetrain train --schedule`: the schedule the simulator
scored is the one the ranks run; flag mistakes are caught before any profiling or launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.timeline import Timeline

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def gpipe_plan(tmp_path: Path) -> Path:
    graph = build_model("mlp-digits")
    names, sizes = graph.names, equal_sizes(32, 4)
    half = len(names) // 2
    plan = Plan(graph.name, graph.fingerprint(), 32, Method.GPIPE,
                (StagePlan(names[:half], (0,), sizes, sizes), StagePlan(names[half:], (1,), sizes, sizes)))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def test_simulated_schedule_is_the_one_trained(
    tmp_path: Path, gpipe_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = Plan.from_json(gpipe_plan.read_text())
    edited = tmp_path / "edited.csv"
    edited.write_text(build_schedule(Plan.from_json(gpipe_plan.read_text().replace('"gpipe"', '"1f1b"'))).to_csv())
    sim = tmp_path / "sim"
    code, text = run(capsys, "simulate", "--plan", str(gpipe_plan), "--schedule", str(edited), "--estimate", "cpu",
                     "--out-dir", str(sim))
    assert code == 0, text
    assert (sim / "schedule.csv").read_text() == edited.read_text()
    out = tmp_path / "run"
    code, text = run(capsys, "train", "--plan", str(gpipe_plan), "--schedule", str(edited), "--steps", "3",
                     "--out-dir", str(out))
    assert code == 0, text
    measured = Timeline.load(out / "measured.json")
    predicted = Timeline.load(sim / "predicted.json")
    for rank in range(plan.n_ranks):
        ran = [e.action for e in sorted(measured.events, key=lambda e: e.start_s) if e.rank == rank]
        scored = [e.action for e in sorted(predicted.events, key=lambda e: e.start_s) if e.rank == rank]
        assert ran == scored


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("0F0[0:8],nonsense\n", "is not a schedule CSV"),
        ("0F0[0:32],0B0[0:32],0STEP\n", "one row per rank"),
    ],
)
def test_bad_schedules_get_one_line(
    content: str, message: str, tmp_path: Path, gpipe_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.csv"
    path.write_text(content)
    code, text = run(capsys, "train", "--plan", str(gpipe_plan), "--schedule", str(path), "--steps", "2",
                     "--out-dir", str(tmp_path / "run"))
    assert code == 2 and message in text, text
    assert text.strip().startswith("error:") and len(text.strip().splitlines()) <= 2


def test_schedule_without_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "train", "--schedule", str(tmp_path / "s.csv"))
    assert code == 2 and "pass --plan" in text


def test_plan_with_dag_edges_is_refused(tmp_path: Path, gpipe_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(gpipe_plan.read_text())
    data["edges"] = [[1, 0]]
    gpipe_plan.write_text(json.dumps(data))
    code, text = run(capsys, "simulate", "--plan", str(gpipe_plan), "--estimate", "cpu", "--out-dir", str(tmp_path))
    assert code == 2 and "form a graph, not the chain" in text
