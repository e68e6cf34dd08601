"""The method record is the only table of methods (docs/architecture.md §4): outside
``plan/methods.py`` and the schedule registry, the library reads a method's traits and never compares
a plan's method with a name (``plan.method is Method.LOCAL``) or keeps its own list of methods
(``(Method.GPIPE, Method.ONE_F_ONE_B)``). Building a plan *of* a method (``Plan(..., Method.ZB1, ...)``)
is not a comparison and stays allowed."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pipetrain

LIBRARY = Path(pipetrain.__file__).parent
TABLES = {LIBRARY / "plan" / "methods.py", LIBRARY / "schedule" / "registry.py"}


def _method(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Method"


def _names_methods(node: ast.AST) -> bool:
    return _method(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(_method, node.elts)))


def _findings(source: str, label: str, table_allowed: bool = False) -> Iterator[str]:
    for node in ast.walk(ast.parse(source, label)):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare) and any(map(_names_methods, [node.left, *node.comparators])):
            yield f"{where}: compares with a method name: {ast.unparse(node)}"
        elif not table_allowed and isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
                sum(map(_method, node.elts)) >= 2:
            yield f"{where}: a table of methods: {ast.unparse(node)[:80]}"
        elif not table_allowed and isinstance(node, ast.Dict) and sum(_method(k) for k in node.keys if k) >= 2:
            yield f"{where}: a table keyed by methods: {ast.unparse(node)[:80]}"


def test_the_library_reads_traits_not_method_names() -> None:
    found = [f for path in sorted(LIBRARY.rglob("*.py"))
             for f in _findings(path.read_text(), str(path.relative_to(LIBRARY.parent)), path in TABLES)]
    assert not found, ("read the method's traits (plan.spec, pipetrain.plan.methods.METHODS) instead:\n"
                       + "\n".join(found))


def test_the_check_sees_comparisons_and_tables() -> None:
    source = ("def f(plan):\n    return plan.method is Method.LOCAL or plan.method in (Method.A, Method.B)\n"
              "ASYNC = {Method.A: 1, Method.B: 2}\nPlan('m', '', 8, Method.ZB1, ())\n")
    assert len([*_findings(source, "bad.py")]) == 4  # two comparisons, the tuple and the dict
    assert len([*_findings(source, "registry.py", table_allowed=True)]) == 2
