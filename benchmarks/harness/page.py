"""BENCHMARKS.md, generated: a summary per area first, then one short section per experiment.

The page is built from the records under ``benchmarks/results/<name>/`` (:mod:`harness.record`)
and the scripts that define each experiment (:mod:`harness.discover`). For each experiment it
shows the newest complete full run, or the newest quick run when there is no full one. Nothing on
the page is typed by hand: a test checks that it equals :func:`build_page` of the results, so a
result that is not on the page, or a figure on the page with no result behind it, fails the suite.
The page-level picture (paper against pipetrain) is drawn by :func:`draw_page_charts`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .experiment import AREAS, Chart, Headline
from .machine import REPO
from .record import Record, cell, records_in

__all__ = ["PAGE", "PAPERS_CHART", "Latest", "build_page", "draw_page_charts", "latest_records"]

PAGE = REPO / "BENCHMARKS.md"
RESULTS = REPO / "benchmarks" / "results"
HISTORY = REPO / "benchmarks" / "history"
PAPERS_CHART = RESULTS / "page" / "papers.png"


@dataclass(frozen=True)
class Latest:
    """An experiment's record shown on the page, and its older complete runs."""

    record: Record
    path: Path
    older: tuple[tuple[Path, Record], ...]


def latest_records(results: Path = RESULTS) -> dict[str, Latest]:
    """Each experiment's newest complete full run (newest quick run when it has no full one)."""
    out: dict[str, Latest] = {}
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        runs = sorted(((p, r) for p, r in records_in(folder) if r.complete), key=lambda pr: (pr[1].started, pr[0].name))
        if not runs:
            continue
        full = [pr for pr in runs if not pr[1].run.quick]
        path, record = (full or runs)[-1]
        out[record.experiment] = Latest(record, path, tuple(pr for pr in reversed(runs) if pr[0] != path))
    return out


def _rel(path: Path) -> str:
    """``path`` relative to the repository (the page's links), or as it is when outside it."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.as_posix()


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _run_text(record: Record) -> str:
    return f"{record.date} `{record.commit}`" + (" quick" if record.run.quick else "")


def _summary_rows(area: str, latest: dict[str, Latest], titles: dict[str, str]) -> list[str]:
    rows = []
    for name in sorted(latest):
        record = latest[name].record
        for h in record.headlines:
            if h.area != area:
                continue
            met = {True: "✅ met", False: "❌ not met", None: "—"}[h.met]
            rows.append(f"| {cell(h.label)} | {h.value_text()} | {cell(h.paper or '—')} | "
                        f"{cell(h.target_text() or '—')} | {met} | {cell(h.config)} | "
                        f"[{name}](#{_anchor(titles[name])}) {_run_text(record)} |")
    return rows


def _charts_of(area: str, latest: dict[str, Latest]) -> list[str]:
    return [f"![{name}: {c['title']}]({_rel(latest[name].path.parent / c['file'])})"
            for name in sorted(latest) for c in latest[name].record.charts if c["area"] == area]


def _counts(latest: dict[str, Latest]) -> str:
    met = [h.met for la in latest.values() for h in la.record.headlines if h.target is not None]
    return (f"{sum(m is True for m in met)} targets met, {sum(m is False for m in met)} not met"
            + (f", {sum(m is None for m in met)} not measured" if any(m is None for m in met) else ""))


def _experiment_section(name: str, title: str, script: Path, latest: Latest | None) -> list[str]:
    lines = [f"### {title}", ""]
    history = HISTORY / f"{name}.md"
    links = [f"script `{_rel(script)}`"]
    if history.exists():
        links.append(f"[history]({_rel(history)})")
    if latest is None:
        return [*lines, " · ".join(links) + ". No complete run with the harness yet.", ""]
    r = latest.record
    m = r.machine
    md = latest.path.with_suffix(".md")
    lines += [f"Latest: {_run_text(r)}, {m.get('cores', '?')} cores, {m.get('device', '?')}, torch "
              f"{m.get('torch', '?')}, load {m.get('load_before', '?')} → {m.get('load_after', '?')}: "
              f"[results]({_rel(md)}) · " + " · ".join(links) + ".", "", f"    {r.command}", ""]
    if r.note:
        lines += [r.note, ""]
    if latest.older:
        older = ", ".join(f"[{_run_text(rec)}]({_rel(p.with_suffix('.md'))})" for p, rec in latest.older[:8])
        lines += [f"Earlier runs: {older}" + (f" and {len(latest.older) - 8} more" if len(latest.older) > 8 else "")
                  + ".", ""]
    return lines


def build_page(entries: Sequence[tuple[str, str, Path]], results: Path = RESULTS) -> str:
    """The page's text from ``entries`` (name, title, script of each experiment) and the records."""
    titles = {name: title for name, title, _ in entries}
    found = latest_records(results) if results.exists() else {}
    latest = {name: la for name, la in found.items() if name in titles}  # a record of a removed script is history
    lines = ["# Benchmarks", "",
             "<!-- Generated by `python benchmarks/make_page.py` from benchmarks/results/: do not edit by hand. "
             "-->", "",
             "How fast pipetrain trains against torch's own pipeline schedules, how well its simulator predicts "
             "what runs, and whether each seed paper's method delivers its headline figure here. Each figure is "
             "the latest run of its experiment (a full run when there is one, else a quick run), with the "
             "machine and the command that produced it. `make benchmarks-quick` reruns every experiment small "
             "and regenerates this page; `python benchmarks/<script>.py` runs one in full. The narrative of past "
             "investigations is in [benchmarks/history/](benchmarks/history/).", "",
             f"**{_counts(latest)}.**", ""]
    for area, heading in AREAS.items():
        rows = _summary_rows(area, latest, titles)
        charts = _charts_of(area, latest)
        if area == "papers" and PAPERS_CHART.exists():
            charts.insert(0, f"![paper against pipetrain]({_rel(PAPERS_CHART)})")
        if not rows and not charts:
            continue
        lines += [f"## {heading}", ""]
        lines += [*(c + "\n" for c in charts)]
        if rows:
            lines += ["| figure | pipetrain | paper | target | met | configuration | run |",
                      "|---|---|---|---|---|---|---|", *rows, ""]
    lines += ["## Experiments", ""]
    for name, title, script in sorted(entries):
        lines += _experiment_section(name, title, script, latest.get(name))
    return "\n".join(lines).rstrip() + "\n"


def papers_chart(latest: dict[str, Latest]) -> Chart | None:
    """Paper against pipetrain for every "papers" headline with a numeric paper figure in ×."""
    pairs: list[Headline] = [h for la in latest.values() for h in la.record.headlines
                             if h.area == "papers" and h.paper_value is not None and h.unit == "×"]
    if not pairs:
        return None
    return Chart("papers", "papers", "Seed papers' speed-ups beside pipetrain's", "bars", "speed-up (×)",
                 categories=tuple(h.label for h in pairs),
                 series=(("paper", tuple(h.paper_value for h in pairs)), ("pipetrain", tuple(h.value for h in pairs))))


def draw_page_charts(results: Path = RESULTS) -> None:
    from .charts import draw

    chart = papers_chart(latest_records(results))
    if chart is not None:
        draw(chart, PAPERS_CHART)
    elif PAPERS_CHART.exists():
        PAPERS_CHART.unlink()
