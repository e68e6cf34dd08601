"""The Core report's torch side: each torch schedule's best micro-batch count, without and with
pipetrain's allocator setting, and the bar chart of samples/s per schedule, torch's beside pipetrain's.

Core measures every ``torch.distributed.pipelining`` schedule of :data:`common.torch_schedules.SCHEDULES`
at the micro-batch counts torch allows; the table gives one row per schedule (its best count, the
others beside it, what torch refused or what failed), so the report shows which schedule is "best
torch" and by how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from harness import Chart

from common.torch_schedules import SCHEDULES

__all__ = ["best_of", "schedule_chart", "torch_schedule_lines"]

# the chart's groups: a torch schedule and pipetrain's of the same name share one (interleaved 1F1B is
# torch's interleaved-1f1b and pipetrain's interleaved), the others stand alone
_GROUPS = (("gpipe", "gpipe", "gpipe"), ("1f1b", "1f1b", "1f1b"), ("zb1", None, "zb1"),
           ("interleaved 1F1B", "interleaved-1f1b", "interleaved"), ("looped-bfs", "looped-bfs", None),
           ("interleaved-zb", "interleaved-zb", None), ("zbv", "zbv", "zbv"), ("dualpipev", "dualpipev", None))


class _Row(Protocol):
    """What this module reads of a configuration's summary (``common.core_report.Summary``)."""

    @property
    def samples_per_s(self) -> float | None: ...

    @property
    def status(self) -> str: ...


def best_of(rows: Mapping[str, _Row], prefix: str) -> tuple[str | None, float | None]:
    """The label and samples/s of the fastest configuration whose label starts with ``prefix``."""
    measured = {k: r.samples_per_s for k, r in rows.items() if k.startswith(prefix) and r.samples_per_s}
    best = max(measured, key=lambda k: measured[k], default=None)
    return best, None if best is None else measured[best]


def _cell(name: str, m: int, rows: Mapping[str, _Row]) -> str:
    """One schedule at one count: its samples/s, its failure, or torch's refusal."""
    if not SCHEDULES[name].allows(m, 2):
        return f"m={m}: not allowed"
    row = rows.get(f"torch {name} m={m}")
    if row is None:
        return f"m={m}: not run"
    if row.samples_per_s is None:
        return f"m={m}: {row.status[:80]}"
    return f"m={m}: {row.samples_per_s:.0f}"


def torch_schedule_lines(rows: Mapping[str, _Row], planned: float | None, micro: Sequence[int]) -> list[str]:
    """Markdown: each torch schedule's best count, its samples/s, its ratio to the best of all torch
    schedules and planned pipetrain's ratio to it; then torch's rules on the count."""
    best_all = best_of(rows, "torch ")[1]
    lines = ["| torch schedule | stages per rank | best m | samples/s | × best torch | planned × this "
             "| with the allocator setting: best m, samples/s | every m (samples/s) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, spec in SCHEDULES.items():
        best, sps = best_of(rows, f"torch {name} m=")
        alloc, alloc_sps = best_of(rows, f"torch+alloc {name} m=")
        alloc_cell = f"m={alloc.rsplit('=', 1)[1]}, {alloc_sps:.1f}" if alloc and alloc_sps else "—"
        cells = "; ".join(_cell(name, m, rows) for m in micro)
        lines.append(
            f"| {name} (`{spec.class_name}`) | {spec.virtual} | {best.rsplit('=', 1)[1] if best else '—'} "
            f"| {f'{sps:.1f}' if sps else '—'} | {f'{sps / best_all:.2f}×' if sps and best_all else '—'} "
            f"| {f'{planned / sps:.2f}×' if planned and sps else '—'} "
            f"| {alloc_cell} | {cells} |")
    rules = "; ".join(f"{name}: {spec.rule}" for name, spec in SCHEDULES.items())
    return [*lines, "", f"torch's rules on the micro-batch count m (2 ranks): {rules}.", ""]


def schedule_chart(model: str, batch: int, rows: Mapping[str, _Row]) -> Chart:
    """Grouped bars: each schedule's samples/s at its best m, torch's beside pipetrain's, and planned."""
    def best(prefix: str | None) -> float | None:
        return None if prefix is None else best_of(rows, prefix)[1]

    torch = (*(best(f"torch {t} m=") if t else None for _, t, _ in _GROUPS), None)
    alloc = (*(best(f"torch+alloc {t} m=") if t else None for _, t, _ in _GROUPS), None)
    planned = rows["planned"].samples_per_s if "planned" in rows else None
    mine = (*(best(f"pipetrain {p} m=") if p else None for _, _, p in _GROUPS), planned)
    series = (("torch", torch), *((("torch, allocator setting", alloc),) if any(alloc) else ()),
              ("pipetrain (allocator setting)", mine))
    return Chart("torch", f"samples-{model}", f"{model}, batch {batch}: samples/s at each schedule's best m "
                 "(2 CPU ranks)", "bars", "samples/s", categories=(*(g[0] for g in _GROUPS), "planned"),
                 series=series)
