"""benchmarks/gpu_check.sh on a CPU: valid bash, a loud failure without a GPU, and (slow) its CPU dry run,
which runs every pipetrain command of the GPU check with --device cpu on gpt-tiny."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _run(*args: str, out: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "STEPS": "2", "BATCH": "4"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure without a GPU")
def test_without_a_gpu_it_fails_loudly(tmp_path: Path) -> None:
    done = _run(out=tmp_path, timeout=120)
    assert done.returncode != 0
    assert "torch sees no GPU" in done.stderr and "gpu_check: FAILED" in done.stderr
    assert _run("--bogus", out=tmp_path, timeout=30).returncode == 2


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_dry_run_runs_every_command(tmp_path: Path) -> None:
    done = _run("--cpu-dry-run", out=tmp_path, timeout=380)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "iteration time on cpu (gloo): predicted" in done.stdout and "gpu_check: OK" in done.stdout
    assert "peak memory per stage, predicted → measured" in done.stdout
    assert (tmp_path / "compare.png").exists()
