"""Where and from what a run came: the machine, the commit and the exact command.

Recorded in every result (``machine``, ``commit``, ``command``) so that a figure on the results
page says which machine and which code produced it. The load average is read before and after:
this project's machine is shared, and a figure measured at load 9 is not one measured at load 1.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["REPO", "command_line", "commit", "load_average", "machine"]

REPO = Path(__file__).resolve().parents[2]


def load_average() -> float:
    """The 1-minute load average (nan where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """Cores, CPU, memory, OS, Python, torch and the accelerator (``"cpu"`` when none)."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"cores": os.cpu_count(), "cpu": _cpu_model(), "memory_gib": _memory_gib(),
            "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "device": device}


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=REPO, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def commit() -> tuple[str, bool]:
    """The short commit of the checkout, and whether tracked files differ from it."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return _git("rev-parse", "--short", "HEAD") or "unknown", dirty


def command_line(script: Path, argv: list[str]) -> str:
    """The command that reruns this: ``python benchmarks/<script> <argv>`` from the repository root."""
    try:
        where = script.resolve().relative_to(REPO)
    except ValueError:
        where = script
    python = Path(sys.executable)
    try:
        python = python.relative_to(REPO)
    except ValueError:
        python = Path("python")
    return shlex.join([str(python), str(where), *argv])
