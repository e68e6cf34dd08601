"""What one benchmark is: its settings, how one setting runs, and how its rows are reported.

An :class:`Experiment` is data, not a subclass: ``settings(ctx)`` lists what to run (and does any
setup they share, e.g. probing the machine), ``run(setting, ctx)`` runs one and returns its rows
(JSON-ready dicts), and ``report(rows, run)`` turns every row of a run into a :class:`Report`:
the markdown tables, the :class:`Headline` figures the results page summarises (each with its
target, met or not) and the :class:`Chart` pictures the harness draws. ``report`` reads rows only,
so a stored run can be reported again after the report changes (``--rereport``).

Rows are dicts with JSON values; the harness adds ``round`` (0-based) to each.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

__all__ = ["AREAS", "Area", "Chart", "Context", "Experiment", "Headline", "Report", "Row", "RunInfo", "Target"]

Row = dict[str, Any]
S = TypeVar("S")

Area = Literal["torch", "fidelity", "papers", "search", "methods"]
AREAS: dict[str, str] = {  # the results page's summary sections, in order
    "torch": "pipetrain against torch's pipeline schedules (measured here)",
    "fidelity": "Prediction fidelity: the simulator against measured runs",
    "papers": "The seed papers' headline figures beside pipetrain's",
    "search": "Search and planning time",
    "methods": "Methods and runtime, measured here",
}

_OP_TEXT = {">=": "≥", "<=": "≤", "abs<=": "|x| ≤"}


@dataclass(frozen=True)
class Target:
    """A figure's goal, ``value op bound``: ``>=`` and ``<=`` compare, ``abs<=`` bounds the magnitude
    (e.g. a prediction error within ±15%: ``Target("abs<=", 15)`` on a figure in %)."""

    op: Literal[">=", "<=", "abs<="]
    bound: float

    def met(self, value: float) -> bool:
        if self.op == ">=":
            return value >= self.bound
        if self.op == "<=":
            return value <= self.bound
        return abs(value) <= self.bound

    def text(self, unit: str) -> str:
        return f"{_OP_TEXT[self.op]} {_number(self.bound, unit)}"


def _number(value: float, unit: str) -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.4g} {unit}".strip()


@dataclass(frozen=True)
class Headline:
    """One figure for the results page's summary.

    ``value`` None: the figure could not be measured in this run (the row says why). ``paper``: the
    seed paper's figure for the same quantity as the paper quotes it, ``paper_value`` the same as a
    number in ``unit`` when it has one (the page plots those). ``config``: what ran, e.g.
    ``"simulated, 8 V100, batch 64"``.
    """

    area: Area
    label: str
    value: float | None
    unit: str = "×"
    target: Target | None = None
    paper: str = ""
    paper_value: float | None = None
    config: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None or self.value is None or math.isnan(self.value):
            return None
        return self.target.met(self.value)

    def value_text(self) -> str:
        return "—" if self.value is None or math.isnan(self.value) else _number(self.value, self.unit)

    def target_text(self) -> str:
        """The target as a markdown table cell (``abs<=``'s ``|x|`` escaped, so it does not split the cell)."""
        return "" if self.target is None else self.target.text(self.unit)


@dataclass(frozen=True)
class Chart:
    """A picture the harness draws (:mod:`harness.charts`).

    ``kind="bars"``: one group of bars per ``categories`` entry, one bar per ``series`` entry
    ``(legend, values)`` with one value per category (None: no bar). ``kind="scatter"``: ``points``
    ``(x, y, label)`` with the line ``y = x`` (predicted against measured). ``kind="lines"``: one line
    per distinct label of ``points`` ``(x, y, label)``, in their order (e.g. a loss against samples).
    """

    area: Area
    slug: str
    title: str
    kind: Literal["bars", "scatter", "lines"]
    y_label: str
    x_label: str = ""
    categories: tuple[str, ...] = ()
    series: tuple[tuple[str, tuple[float | None, ...]], ...] = ()
    points: tuple[tuple[float, float, str], ...] = ()


@dataclass(frozen=True)
class Report:
    """What a run says: ``markdown`` (its tables and findings), its headlines and charts."""

    markdown: str
    headlines: tuple[Headline, ...] = ()
    charts: tuple[Chart, ...] = ()


@dataclass(frozen=True)
class RunInfo:
    """How a run was asked for: what ``report`` may read besides the rows (stored in the record)."""

    quick: bool
    repeats: int
    seed: int
    options: dict[str, Any] = field(default_factory=dict)  # the experiment's own arguments


@dataclass(frozen=True)
class Context:
    """What ``settings`` and ``run`` get: the parsed arguments, the run's info, where artifacts go."""

    args: argparse.Namespace
    info: RunInfo
    artifacts: Path  # a folder for this run's extra files (profiles, clusters, timelines)
    round: int = 0

    @property
    def quick(self) -> bool:
        return self.info.quick

    @property
    def seed(self) -> int:
        return self.info.seed

    def artifact(self, name: str) -> Path:
        """``<artifacts>/<name>``, its folder created."""
        self.artifacts.mkdir(parents=True, exist_ok=True)
        return self.artifacts / name

    def log(self, message: str) -> None:
        print(message, flush=True)


@dataclass(frozen=True)
class Experiment(Generic[S]):
    """A benchmark: ``name`` names its results folder (``benchmarks/results/<name>/``), ``title`` is
    one line for the page, ``repeats`` the rounds a full run makes (1 for deterministic simulations;
    each round runs every setting, starting one later than the round before, so that A and B
    alternate), ``arguments`` adds its own command-line options."""

    name: str
    title: str
    settings: Callable[[Context], Sequence[S]]
    run: Callable[[S, Context], list[Row]]
    report: Callable[[list[Row], RunInfo], Report]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    repeats: int = 1
    quick_repeats: int = 1
