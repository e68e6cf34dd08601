"""The benchmark scripts, found without importing them: each ``benchmarks/*.py`` that assigns
``EXPERIMENT = Experiment(name="…", title="…", …)`` (name and title as string literals)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .machine import REPO

__all__ = ["BENCHMARKS", "Entry", "entries"]

BENCHMARKS = REPO / "benchmarks"


@dataclass(frozen=True)
class Entry:
    name: str
    title: str
    script: Path


def _literal(call: ast.Call, key: str) -> str | None:
    for kw in call.keywords:
        if kw.arg == key and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    return None


def _entry(path: Path) -> Entry | None:
    for node in ast.parse(path.read_text(), str(path)).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPERIMENT" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            name, title = _literal(node.value, "name"), _literal(node.value, "title")
            if name is None or title is None:
                raise ValueError(f"{path}: EXPERIMENT's name and title must be string literals (the page reads them "
                                 f"without importing the script)")
            return Entry(name, title, path)
    return None


def entries(folder: Path = BENCHMARKS) -> list[Entry]:
    """Every experiment under ``folder``, by name; two scripts with one name is an error."""
    found: dict[str, Entry] = {}
    for path in sorted(folder.glob("*.py")):
        entry = _entry(path)
        if entry is None:
            continue
        if entry.name in found:
            raise ValueError(f"{path} and {found[entry.name].script} both name their experiment {entry.name!r}")
        found[entry.name] = entry
    return sorted(found.values(), key=lambda e: e.name)
