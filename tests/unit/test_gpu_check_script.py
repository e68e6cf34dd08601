"""benchmarks/gpu_check.sh on a CPU: valid bash, a loud failure without a GPU, and every pipetrain
command it runs accepted by the CLI (its ``--cpu-dry-run`` runs them all on a CPU, by hand)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipetrain.cli import build_parser

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


def _pipetrain_commands() -> list[list[str]]:
    """Every ``"$PYTHON" -m pipetrain ...`` line of the script (continuations joined), with the CPU dry
    run's values for its variables."""
    values = {"$MODEL": "gpt-tiny", "$BATCH": "8", "$DEVICE": "cpu", "$REPEATS": "1", "$RANKS": "2",
              "$BACKEND": "gloo", "$STEPS": "3", "$OUT": "out/gpu-check"}
    text = SCRIPT.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if '"$PYTHON" -m pipetrain ' in line:
            words = shlex.split(line.split('"$PYTHON" -m pipetrain ', 1)[1])
            for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
                words = [w.replace(name, value) for w in words]
            commands.append(words)
    return commands


def test_every_pipetrain_command_of_the_script_parses() -> None:
    """Each command's flags and choices are the CLI's (the whole flow runs with ``--cpu-dry-run``,
    about a minute here: ``benchmarks/gpu_check.sh --cpu-dry-run``)."""
    commands = _pipetrain_commands()
    assert [c[0] for c in commands] == ["profile", "plan", "simulate", "train", "compare"]
    for argv in commands:
        args = build_parser(only=[argv[0]]).parse_args(argv)
        assert args.command == argv[0]
