"""A run's record on disk: ``benchmarks/results/<name>/<date>-<commit>[-quick].json`` and ``.md``.

The JSON holds everything the results page and a later ``--rereport`` need: the experiment, when,
the commit (``+dirty`` when tracked files differed), the exact command, the machine with its load
before and after, how it was asked for (:class:`RunInfo`), every row, and the report's headlines
and charts. ``complete`` is false while the run is going (the record is rewritten after each
setting, so a stopped run keeps what it measured); the page reads complete records only.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .experiment import Headline, Report, Row, RunInfo, Target

__all__ = ["FORMAT", "Record", "cell", "headline_from", "load_record", "record_stem", "records_in", "render_markdown"]

FORMAT = 1


@dataclass
class Record:
    """One run of one experiment (see the module docstring)."""

    experiment: str
    title: str
    started: str  # ISO date and time, UTC
    commit: str
    command: str
    machine: dict[str, Any]
    run: RunInfo
    rows: list[Row] = field(default_factory=list)
    headlines: list[Headline] = field(default_factory=list)
    charts: list[dict[str, str]] = field(default_factory=list)  # {"file", "area", "title"}: pictures beside it
    markdown: str = ""
    complete: bool = False
    wall_s: float | None = None
    note: str = ""  # provenance beyond the fields, e.g. a run made before the harness

    @property
    def date(self) -> str:
        return self.started[:10]

    def to_json(self) -> str:
        data = asdict(self)
        data["format"] = FORMAT
        return json.dumps(data, indent=1)

    def apply(self, report: Report, chart_files: list[str]) -> None:
        """Take ``report``'s text and figures; ``chart_files`` names the picture of each of its charts."""
        self.markdown, self.headlines = report.markdown, list(report.headlines)
        self.charts = [{"file": f, "area": c.area, "title": c.title}
                       for f, c in zip(chart_files, report.charts, strict=True)]


def record_stem(date: str, commit: str, quick: bool) -> str:
    """``2026-11-28-3b4cb88`` (``-quick`` for a quick run)."""
    return f"{date}-{commit}" + ("-quick" if quick else "")


def headline_from(data: dict[str, Any]) -> Headline:
    target = data.get("target")
    return Headline(**{**data, "target": Target(**target) if target else None})


def load_record(path: Path) -> Record:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:  # e.g. a legacy result that is a list
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} is not a harness record (format {found!r}, expected {FORMAT})")
    data.pop("format")
    data["run"] = RunInfo(**data["run"])
    data["headlines"] = [headline_from(h) for h in data["headlines"]]
    return Record(**data)


def records_in(folder: Path) -> list[tuple[Path, Record]]:
    """The harness records in ``folder`` (other JSON files, e.g. a run's profiles, are skipped)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append((path, load_record(path)))
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            continue
    return out


def cell(text: str) -> str:
    """``text`` for a markdown table cell: its ``|`` escaped (a target reads ``|x| ≤ 15%``)."""
    return text.replace("|", "\\|")


def _headline_line(h: Headline) -> str:
    met = {True: "met", False: "**not met**", None: "—"}[h.met]
    return (f"| {cell(h.label)} | {h.value_text()} | {cell(h.paper or '—')} | {cell(h.target_text() or '—')} | {met} "
            f"| {cell(h.config)} |")


def render_markdown(record: Record) -> str:
    """The run's markdown file: what ran where, its headlines, then the report's own tables."""
    m = record.machine
    load = f"load {m.get('load_before', '?')} → {m.get('load_after', '?')}"
    wall = "" if record.wall_s is None or math.isnan(record.wall_s) else f", {record.wall_s:.0f} s"
    lines = [f"# {record.title}", "",
             f"Run {record.started} UTC at commit `{record.commit}`{wall}"
             + (" (quick run)" if record.run.quick else "") + ".", "",
             f"    {record.command}", "",
             f"Machine: {m.get('cores', '?')} cores ({m.get('cpu', '?')}), {m.get('device', '?')}, "
             f"torch {m.get('torch', '?')}, {load}."]
    if record.note:
        lines += ["", record.note]
    if record.headlines:
        lines += ["", "| figure | pipetrain | paper | target | met | configuration |", "|---|---|---|---|---|---|"]
        lines += [_headline_line(h) for h in record.headlines]
    lines += [f"\n![{c['title']}]({c['file']})" for c in record.charts]
    return "\n".join(lines) + "\n\n" + record.markdown.strip() + "\n"
