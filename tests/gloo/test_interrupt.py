"""Ctrl-C and SIGTERM during training (level c), as a user meets them: every rank stops at one step
boundary, the CLI prints one line and exits 130 / 143 without a traceback, and with checkpointing on
it first writes a checkpoint that ``--resume`` continues from."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipetrain.runtime.job.checkpoint import newest_checkpoint
from pipetrain.runtime.job.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRAIN = [sys.executable, "-m", "pipetrain", "train", "--model", "mlp-digits", "--ranks", "2", "--batch", "32",
         "--profile", "{profile}", "--no-probe", "--planner", "balanced"]
"""A subprocess (the conftest's stub of the probe does not reach it); the quick planner (planning is not under test)."""


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One profile for every test of the module (profiling is not what they test)."""
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    subprocess.run([sys.executable, "-m", "pipetrain", "profile", "--model", "mlp-digits", "--batch", "32",
                    "--repeats", "1", "--out", str(path)], check=True, capture_output=True, timeout=120)
    return path


def _start(tmp: Path, profile: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [a.format(profile=profile) for a in TRAIN] + list(extra)
    return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(csv: Path, rows: int, deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if csv.exists() and len(read_metrics(csv)) >= rows:
            return
        time.sleep(0.2)
    raise AssertionError(f"training did not reach {rows} steps in {deadline_s} s")


@pytest.mark.parametrize(("signum", "code", "resume"), [(signal.SIGINT, 130, True), (signal.SIGTERM, 143, False)])
def test_signal_stops_every_rank_with_one_line(tmp_path: Path, profile: Path, signum: int, code: int,
                                               resume: bool) -> None:
    """Either signal stops every rank at a step boundary after a checkpoint; the resume from it (the
    same code path whichever signal wrote it) is run once, after SIGINT."""
    run = _start(tmp_path, profile, "--steps", "100000", "--out-dir", "run", "--checkpoint-dir", "ckpt")
    _wait_for_rows(tmp_path / "run" / "metrics.csv", 5)
    run.send_signal(signum)
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == code, stderr
    assert "Traceback" not in stdout + stderr
    text = stdout + stderr
    assert f"interrupted by {signal.Signals(signum).name}" in text and "--resume" in text
    checkpoint = newest_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.step >= 5
    if not resume:
        return
    resumed = subprocess.run([a.format(profile=profile) for a in TRAIN]
                             + ["--steps", str(checkpoint.step + 3), "--out-dir", "run", "--resume", "ckpt",
                                "--checkpoint-dir", "ckpt"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from the checkpoint of step {checkpoint.step}" in resumed.stdout
    assert (tmp_path / "run" / "plan.json").exists() and (tmp_path / "run" / "plan.profile.json").exists()  # no --plan
    steps = [row.step for row in read_metrics(tmp_path / "run" / "metrics.csv")]
    assert steps == list(range(checkpoint.step + 3))  # the rows after the checkpoint are replaced, none lost
