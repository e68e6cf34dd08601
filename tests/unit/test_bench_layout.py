"""The benchmarks' layout (issue 31): every script is one experiment on the harness, scripts import
the harness and ``benchmarks/common`` only (never each other), and the results page is in sync."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness.discover import BENCHMARKS as BENCH
from harness.discover import entries
from harness.page import PAGE, build_page

TOOLS = {"run_all.py", "make_page.py"}  # the harness's own entry points


def _local_imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports that live under benchmarks/."""
    local = {p.stem for p in BENCH.glob("*.py")} | {p.name for p in BENCH.iterdir() if p.is_dir()}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in local}
    return found


def test_every_script_is_an_experiment() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")} - TOOLS
    named = {e.script.name for e in entries()}
    assert scripts == named, f"scripts without EXPERIMENT = Experiment(name=..., title=...): {sorted(scripts - named)}"


def test_scripts_import_only_the_harness_and_common() -> None:
    for path in sorted(BENCH.glob("*.py")):
        extra = _local_imports(path) - {"harness", "common"} - ({"make_page"} if path.name in TOOLS else set())
        assert not extra, f"{path.name} imports scripts {sorted(extra)}: move what they share to benchmarks/common/"
    for path in sorted((BENCH / "common").glob("*.py")) + sorted((BENCH / "harness").glob("*.py")):
        extra = _local_imports(path) - {"harness", "common"}
        assert not extra, f"{path.relative_to(BENCH)} imports benchmark scripts {sorted(extra)}"


def test_the_harness_does_not_import_common() -> None:
    for path in sorted((BENCH / "harness").glob("*.py")):
        assert "common" not in _local_imports(path), f"harness/{path.name} imports benchmarks/common"


def test_the_results_page_is_in_sync_with_the_results() -> None:
    page = build_page([(e.name, e.title, e.script) for e in entries()])
    assert PAGE.read_text() == page, "BENCHMARKS.md is not in sync with benchmarks/results/: run " \
                                     ".venv/bin/python benchmarks/make_page.py and commit the page"
