"""A user's own model and data on the command line (level c), as a newcomer runs them: a file in the
working directory, named ``module:callable`` to ``plan`` and ``train``; the spawned ranks import it
from there too. The run learns and leaves ``metrics.csv`` and ``loss.png``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipetrain.runtime.job.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_model.py"


def _pipetrain(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipetrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=200)


def test_user_model_from_the_working_directory(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "mymodel.py")
    model = ["--model", "mymodel:build", "--data", "mymodel:digits_data"]
    planned = _pipetrain(tmp_path, "plan", *model, "--batch", "64", "--ranks", "2", "--method", "1f1b",
                         "--no-probe", "--out", "plan.json")  # no probe of this machine, no cache in ~/.cache
    assert planned.returncode == 0, planned.stderr
    trained = _pipetrain(tmp_path, "train", "--plan", "plan.json", "--data", "mymodel:digits_data", "--epochs", "2",
                         "--lr", "0.05", "--out-dir", "run")
    assert trained.returncode == 0, trained.stderr
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert len(rows) == 2 * (1437 // 64)
    assert rows[-1].eval_accuracy is not None and rows[-1].eval_accuracy > 0.8
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    assert "accuracy" in trained.stdout


def test_user_model_without_data_says_what_to_pass(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "mymodel.py")
    result = _pipetrain(tmp_path, "plan", "--model", "mymodel:build", "--ranks", "2")
    assert result.returncode == 2
    assert "--data" in result.stdout + result.stderr and "Traceback" not in result.stderr
