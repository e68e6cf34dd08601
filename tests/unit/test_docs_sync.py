"""The docs name what the code has (issue 32, item 7): every action kind, planner, method and zoo
model the docs name exists, and every one that exists is documented; every ``--flag`` shown with a
``pipetrain <command>`` (in a code block or an inline code span) is one that command's parser takes,
and the values shown for ``--method``, ``--planner`` and ``--model`` are real ones.

A failure names the page, the line and what it names that the code lacks (or what the code has that
the page leaves out). Flags the docs do not mention are not failures: new flags may come first.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from pipetrain.cli.main import COMMANDS, build_parser
from pipetrain.graph.zoo import MODEL_NAMES
from pipetrain.plan.methods import Method
from pipetrain.planners.registry import PLANNERS
from pipetrain.schedule.action import Action, ActionKind

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FORMATS = ROOT / "docs" / "formats.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_COMMAND = "|".join(re.escape(c) for c in COMMANDS)
_INVOCATION = re.compile(rf"(?:^|\bpipetrain )((?:{_COMMAND})(?:\|(?:{_COMMAND}))*)(?= |$)(.*)")
"""``pipetrain plan --x`` anywhere, or a span that starts with a command (``simulate|train --method zbv``)."""
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([^\s`]+))?")
_VALUES: dict[str, frozenset[str]] = {
    "--method": frozenset(m.value for m in Method),
    "--planner": frozenset(PLANNERS),
    "--model": frozenset(MODEL_NAMES),
}


class Mention(NamedTuple):
    """Code on a page: where it is, and its text (a code span, or a line of a fenced block)."""

    page: Path
    line: int
    text: str
    in_block: bool

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code(page: Path) -> Iterator[Mention]:
    """Every inline code span outside fenced blocks and every line inside them, with its line number
    (a table's escaped ``\\|`` read as ``|``)."""
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        line = line.replace("\\|", "|")
        if fenced:
            yield Mention(page, number, line.split(" #")[0], True)
        else:
            yield from (Mention(page, number, span, False) for span in re.findall(r"`([^`]+)`", line))


def _options() -> dict[str, frozenset[str]]:
    """Every command's option strings (``--no-memory-cap`` included)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: frozenset(o for action in command._actions for o in action.option_strings)
            for name, command in sub.choices.items()}


OPTIONS = _options()


def _placeholder(value: str) -> bool:
    """A value that stands for one (``M``, ``P``, ``…``, ``<k>``, ``module.path:callable``), not a name."""
    return not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", value) or value.endswith(".")


def _flag_problems(mention: Mention) -> Iterator[str]:
    for match in _INVOCATION.finditer(mention.text):
        commands, rest = match.group(1).split("|"), match.group(2)
        for flag, value in _FLAG.findall(rest):
            for command in commands:
                if flag not in OPTIONS[command]:
                    yield f"{mention.where()}: `{mention.text.strip()}` shows `pipetrain {command} {flag}`, " \
                          f"which {command} does not take"
            known = _VALUES.get(flag, frozenset())
            for one in (value.split("|") if known and value else ()):
                if not _placeholder(one) and one not in known:
                    yield f"{mention.where()}: `{mention.text.strip()}` shows `{flag} {one}`, which is not one " \
                          f"of {', '.join(sorted(known))}"


def test_every_flag_shown_with_a_command_is_taken_by_it() -> None:
    problems = [p for page in PAGES for mention in code(page) for p in _flag_problems(mention)]
    assert not problems, "flags or values the docs show that the CLI does not take:\n" + "\n".join(problems)


def test_the_flag_check_catches_a_wrong_flag() -> None:
    """The check itself: an unknown flag, a flag of another command and an unknown method are caught."""
    shown = [Mention(README, 1, text, False) for text in (
        "pipetrain plan --model mlp --no-such-flag", "simulate|train --steps 3", "plan --method gpipe2",
        "pipetrain plan --method 1f1b --planner auto --model mlp-digits --no-memory-cap")]
    found = [list(_flag_problems(m)) for m in shown]
    assert [len(f) for f in found] == [1, 1, 1, 0], found
    assert "simulate does not take" in found[1][0] and "`--method gpipe2`" in found[2][0]


def _section(page: Path, start: str, end: str) -> str:
    """The text of ``page`` from the first ``start`` to the next ``end`` after it."""
    text = page.read_text()
    assert start in text, f"{page.relative_to(ROOT)} has no {start!r}, where the test reads its list"
    text = text[text.index(start):]
    return text[:text.index(end, len(start))]


def _code_words(text: str) -> set[str]:
    """Every word of every code span of ``text`` (split on spaces, commas and ``|``)."""
    return {word for span in re.findall(r"`([^`]+)`", text.replace("\\|", "|"))
            for word in re.split(r"[\s,|()]+", span) if word}


_PLANNER_LISTS = {README: ("Planners:", "\n\n"), ARCHITECTURE: ("The planners:", "`api.plan()`")}
_METHOD_LISTS = {README: ("## Methods", "## How it works"), ARCHITECTURE: ("The methods:", "\n\n")}


@pytest.mark.parametrize("page", list(_PLANNER_LISTS), ids=lambda p: p.name)
def test_every_planner_is_documented(page: Path) -> None:
    start, end = _PLANNER_LISTS[page]
    missing = [name for name in PLANNERS if name not in _code_words(_section(page, start, end))]
    assert not missing, f"{page.relative_to(ROOT)}: the list of planners after {start!r} leaves out {missing}; " \
                        f"name each in code (`{missing[0]}`)"


@pytest.mark.parametrize("page", list(_METHOD_LISTS), ids=lambda p: p.name)
def test_every_method_is_documented(page: Path) -> None:
    start, end = _METHOD_LISTS[page]
    missing = [m.value for m in Method if m.value not in _code_words(_section(page, start, end))]
    assert not missing, f"{page.relative_to(ROOT)}: the methods after {start!r} leave out {missing}; name each " \
                        f"in code (`{missing[0]}`)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_method_table_row_is_a_method(page: Path) -> None:
    """Rows of a methods table (those after a ``| method |`` header) name methods that exist."""
    problems, in_table = [], False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith("| method |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and (row := re.match(r"\| `([^` ]+)[^`]*` \|", line)) and row.group(1) not in _VALUES["--method"]:
            problems.append(f"{page.relative_to(ROOT)}:{number}: method `{row.group(1)}` does not exist")
    assert not problems, "\n".join(problems)


def test_every_zoo_model_is_in_the_readme() -> None:
    text = README.read_text()
    zoo = text[text.index("Zoo models:"):]
    zoo = zoo[:zoo.index("\n\n")]
    missing = [name for name in MODEL_NAMES if f"`{name}`" not in zoo]
    assert not missing, f"README.md's 'Zoo models:' paragraph leaves out {missing}; name each as `{missing[0]}`"


@pytest.mark.parametrize("page", [FORMATS, ARCHITECTURE], ids=lambda p: p.name)
def test_every_action_kind_is_documented(page: Path) -> None:
    text = page.read_text()
    missing = [k.value for k in ActionKind if f"`{k.value}`" not in text and not re.search(
        rf"`\d+{k.value}[\d\[`]", text)]
    assert not missing, f"{page.relative_to(ROOT)} never shows action kind(s) {missing}; list every kind"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_action_shown_parses(page: Path) -> None:
    """Actions written out in code (``2F0[0:16]``, ``0W0[0:16]``, ``1RECV_F1[16:32]<0``) parse, and every
    kind a page calls reserved or planned is one the schedule writes by now."""
    kinds = "|".join(sorted((k.value for k in ActionKind), key=len, reverse=True))
    problems = []
    for mention in code(page):
        for word in re.findall(r"(?<![\w\[])\d+(?:[A-Z][A-Z_]*\d+(?:\[\d+:\d+\])?(?:[<>]\d+)?(?:v\d+)?|STEP)"
                               r"(?![\w\]])", mention.text):
            if not re.fullmatch(rf"\d+(?:{kinds}).*", word):
                problems.append(f"{mention.where()}: `{word}` has no action kind of {kinds}")
                continue
            try:
                Action.parse(word)
            except ValueError as e:
                problems.append(f"{mention.where()}: `{word}` does not parse ({e})")
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if re.search(r"`W`[^.;]*\breserved\b", line):
            problems.append(f"{page.relative_to(ROOT)}:{number}: calls `W` reserved, but zb1, zb2, zbv and "
                            "interleaved-zb write W actions (`0W0[0:16]`)")
    assert not problems, "\n".join(problems)
