"""Packages import downward only: the import-linter contracts in pyproject.toml hold.

The layers, lowest first: errors/fileio/allocator (shared leaves) → graph, cluster → profile →
cost, cluster_spec → plan → schedule → simulate → planners → data → runtime → calibrate | reference →
viz → api → demo → cli → __main__; inside the runtime, interp → job → process → train. ``make test``
runs the same check as ``lint-imports``. This test is there so that ``pytest`` alone also catches an
upward import.

Every import counts: module level, inside a function, and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    command = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [*command, "--no-cache", "--no-logo"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_packages_import_downward_only() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, (
        "an import goes up a layer (see [tool.importlinter] in pyproject.toml):\n" + result.stdout + result.stderr
    )


def test_contract_catches_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """The contract is not vacuous: upward imports inside a function or under TYPE_CHECKING break it."""
    shutil.copytree(ROOT / "pipetrain", tmp_path / "pipetrain", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "pipetrain" / "graph" / "layer_graph.py").open("a") as f:
        f.write("\n\ndef _upward() -> None:\n    from pipetrain.plan.plan import Plan  # noqa: F401\n")
    with (tmp_path / "pipetrain" / "cost.py").open("a") as f:
        f.write("\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n")
        f.write("    from pipetrain.schedule.action import Action  # noqa: F401\n")
    result = _lint_imports(tmp_path, pythonpath=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pipetrain.graph.layer_graph -> pipetrain.plan.plan" in result.stdout
    assert "pipetrain.cost -> pipetrain.schedule.action" in result.stdout
