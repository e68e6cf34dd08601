"""A :class:`Schedule`: for every rank, the ordered tuple of actions it executes.

The schedule is a value (STYLE.md L1): the validator, the simulator and the runtime all consume
exactly this object. It prints as a step × rank grid and round-trips through CSV (one row per rank,
one action per cell) and JSON.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pipetrain.schedule.action import Action, ActionKind

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """Per-rank programs.

    Attributes:
        ranks: ``ranks[r]`` is the tuple of actions rank ``r`` runs, in order. Ranks are ``0..R-1``.
    """

    ranks: tuple[tuple[Action, ...], ...]

    @classmethod
    def from_lists(cls, programs: Sequence[Sequence[Action]]) -> Schedule:
        return cls(tuple(tuple(p) for p in programs))

    @classmethod
    def from_mapping(cls, programs: Mapping[int, Sequence[Action]]) -> Schedule:
        n = max(programs, default=-1) + 1
        return cls(tuple(tuple(programs.get(r, ())) for r in range(n)))

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    def __iter__(self) -> Iterator[tuple[int, tuple[Action, ...]]]:
        return iter(enumerate(self.ranks))

    def actions(self) -> Iterator[tuple[int, int, Action]]:
        """Every ``(rank, step, action)``."""
        for rank, program in enumerate(self.ranks):
            for step, action in enumerate(program):
                yield rank, step, action

    def directed_links(self) -> tuple[tuple[int, int], ...]:
        """Every ``(src, dst)`` some SEND of the schedule uses, sorted (the same on every rank)."""
        sends = (ActionKind.SEND_F, ActionKind.SEND_B)
        links = {(rank, a.peer) for rank, _, a in self.actions() if a.kind in sends and a.peer is not None}
        return tuple(sorted(links))

    # ---- text forms -------------------------------------------------------------------------

    def grid(self, mark: tuple[int, int] | None = None, max_steps: int | None = None) -> str:
        """Render a step × rank table; ``mark=(rank, step)`` brackets that cell with ``>> <<``."""
        n_steps = max((len(p) for p in self.ranks), default=0)
        shown = n_steps if max_steps is None else min(n_steps, max_steps)
        cells = [[""] + [f"rank {r}" for r in range(self.n_ranks)]]
        for step in range(shown):
            row = [f"{step}"]
            for rank, program in enumerate(self.ranks):
                text = str(program[step]) if step < len(program) else ""
                if mark == (rank, step):
                    text = f">>{text}<<"
                row.append(text)
            cells.append(row)
        widths = [max(len(row[c]) for row in cells) for c in range(len(cells[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        if shown < n_steps:
            lines.append(f"... {n_steps - shown} more steps")
        return "\n".join(lines)

    def to_csv(self) -> str:
        """One line per rank, one action per cell; parsed back exactly by :meth:`from_csv`."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for program in self.ranks:
            writer.writerow([str(a) for a in program])
        return buffer.getvalue()

    @classmethod
    def from_csv(cls, text: str) -> Schedule:
        """Parse :meth:`to_csv` output (also a hand-written schedule, one row per rank)."""
        rows = csv.reader(io.StringIO(text))
        return cls.from_lists([[Action.parse(c) for c in row if c.strip()] for row in rows])

    def to_json(self) -> str:
        return json.dumps({"ranks": [[str(a) for a in p] for p in self.ranks]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        data = json.loads(text)
        return cls.from_lists([[Action.parse(a) for a in p] for p in data["ranks"]])

    def __str__(self) -> str:
        return self.grid()
