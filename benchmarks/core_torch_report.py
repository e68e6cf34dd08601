"""The core benchmark's per-schedule table: every torch schedule's best micro-batch count.

:mod:`bench_core` measures every ``torch.distributed.pipelining`` schedule of
:data:`torch_schedules.SCHEDULES` at the micro-batch counts torch allows; this module turns its
per-configuration medians into one row per schedule (its best count, the others beside it, what
torch refused or what failed), so the report shows which schedule is "best torch" and by how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from common.torch_schedules import SCHEDULES

__all__ = ["micro_of", "torch_schedule_lines"]


class _Row(Protocol):
    """What this module reads of ``bench_core.Summary``."""

    @property
    def samples_per_s(self) -> float | None: ...

    @property
    def status(self) -> str: ...


def micro_of(labels: Sequence[str]) -> list[int]:
    """The micro-batch counts of the grid, from its pipetrain labels."""
    return sorted({int(k.rsplit("m=", 1)[1]) for k in labels if k.startswith("pipetrain")})


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
    """Markdown: a table with each torch schedule's best count, its samples/s, its ratio to the best
    of all torch schedules and planned pipetrain's ratio to it; then torch's rules on the count."""
    measured = {k: r.samples_per_s for k, r in rows.items() if k.startswith("torch ") and r.samples_per_s}
    best_all = max(measured.values(), default=None)
    lines = ["| torch schedule | stages per rank | best m | samples/s | × best torch | planned × this "
             "| every m (samples/s) |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, spec in SCHEDULES.items():
        mine = {k: v for k, v in measured.items() if k.startswith(f"torch {name} m=")}
        best = max(mine, key=lambda k: mine[k], default=None)
        sps = mine[best] if best else None
        cells = "; ".join(_cell(name, m, rows) for m in micro)
        lines.append(
            f"| {name} (`{spec.class_name}`) | {spec.virtual} | {best.rsplit('=', 1)[1] if best else '—'} "
            f"| {f'{sps:.1f}' if sps else '—'} | {f'{sps / best_all:.2f}×' if sps and best_all else '—'} "
            f"| {f'{planned / sps:.2f}×' if planned and sps else '—'} | {cells} |")
    rules = "; ".join(f"{name}: {spec.rule}" for name, spec in SCHEDULES.items())
    return [*lines, "", f"torch's rules on the micro-batch count m (2 ranks): {rules}.", ""]
