"""Timeline: when each action ran, predicted by the simulator or measured by the runtime.

Both producers emit this one type, so ``pipetrain compare`` and the pictures treat predictions and
measurements alike. Times are seconds from the start of the iteration.

For compute actions an event spans the computation on the rank. For a SEND, it spans the transfer
on the link (simulated) or the call that posted it (measured); a simulated SEND also records the
seconds its rank spent on the message before it left (``host_s``), so that :attr:`Event.rank_s` is
what the rank itself spent, predicted or measured alike. For a RECV, the time the rank waited.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.schedule.action import COMPUTE_KINDS, Action, ActionKind

__all__ = ["Event", "StageSummary", "Timeline"]


@dataclass(frozen=True)
class Event:
    """One action's interval on one rank.

    ``host_s``: a simulated SEND's seconds of its rank's own work on the message before it left
    (:meth:`~pipetrain.cost.CostModel.send_host_s`; 0 for a cluster whose messages cost the ranks
    nothing), its span being the link's transfer; None for every other event, whose span is the rank's.
    """

    rank: int
    action: Action
    start_s: float
    end_s: float
    host_s: float | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def rank_s(self) -> float:
        """Seconds the rank itself spent on the action: its span, but a simulated SEND's ``host_s``
        (a measured SEND's span is the call that posted it: the same thing)."""
        return self.duration_s if self.host_s is None else self.host_s


@dataclass(frozen=True)
class StageSummary:
    """Per-stage summary of a timeline."""

    stage: int
    busy_s: float
    bubble_fraction: float
    peak_activation_bytes: int


@dataclass(frozen=True)
class Timeline:
    """Every rank's events for one iteration.

    Attributes:
        events: all events, any order.
        n_ranks: number of ranks.
        kind: ``"predicted"`` or ``"measured"``.
        peak_activation_bytes: per rank, the peak bytes of activations kept for backward.
        label: free text for reports (method, plan, machine).
        iterations: for measured timelines, every measured iteration's time (the events are from
            the median one).
        prepost_bytes: per rank, the receive buffers posted at a step's start, at most over its steps
            (:mod:`pipetrain.schedule.prepost`; memory beside the activations); empty when unknown.
    """

    events: tuple[Event, ...]
    n_ranks: int
    kind: str = "predicted"
    peak_activation_bytes: tuple[int, ...] = ()
    label: str = ""
    iterations_s: tuple[float, ...] = field(default=())
    prepost_bytes: tuple[int, ...] = ()

    @property
    def iteration_s(self) -> float:
        """Makespan: last end minus first start (the median iteration for measured runs)."""
        if self.iterations_s:
            return statistics.median(self.iterations_s)
        if not self.events:
            return 0.0
        return max(e.end_s for e in self.events) - min(e.start_s for e in self.events)

    def rank_events(self, rank: int) -> list[Event]:
        return sorted((e for e in self.events if e.rank == rank), key=lambda e: e.start_s)

    def busy_s(self, rank: int) -> float:
        """Seconds the rank spent computing (F, B, W and STEP)."""
        return self.busy_by_rank()[rank]

    def busy_by_rank(self) -> list[float]:
        """:meth:`busy_s` of every rank, in one pass over the events (each rank's sum in event order)."""
        busy = [0.0] * self.n_ranks
        for e in self.events:
            if e.rank < self.n_ranks and (e.action.kind in COMPUTE_KINDS or e.action.kind is ActionKind.STEP):
                busy[e.rank] += e.duration_s
        return busy

    def summary(self, stage_of_rank: Sequence[int] | None = None) -> list[StageSummary]:
        """One row per stage (a replicated stage: the mean over its ranks; memory: the max)."""
        mapping = list(stage_of_rank) if stage_of_rank is not None else list(range(self.n_ranks))
        span = self.iteration_s or 1.0
        rows, busy_s = [], self.busy_by_rank()
        for stage in sorted(set(mapping)):
            ranks = [r for r, s in enumerate(mapping) if s == stage]
            busy = statistics.fmean(busy_s[r] for r in ranks)
            peak = max((self.peak_activation_bytes[r] for r in ranks if r < len(self.peak_activation_bytes)), default=0)
            rows.append(StageSummary(stage, busy, max(0.0, 1.0 - busy / span), peak))
        return rows

    def bubble_fraction(self) -> float:
        """Mean idle fraction over ranks."""
        span = self.iteration_s or 1.0
        return statistics.fmean(max(0.0, 1.0 - busy / span) for busy in self.busy_by_rank())

    # ---- JSON -------------------------------------------------------------------------------

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "kind": self.kind,
            "label": self.label,
            "n_ranks": self.n_ranks,
            "iteration_s": self.iteration_s,
            "iterations_s": list(self.iterations_s),
            "peak_activation_bytes": list(self.peak_activation_bytes),
            "prepost_bytes": list(self.prepost_bytes),
            "events": [[e.rank, str(e.action), e.start_s, e.end_s, *(() if e.host_s is None else (e.host_s,))]
                       for e in self.events],
        }
        return json.dumps(data, indent=0)

    @classmethod
    def from_json(cls, text: str) -> Timeline:
        try:
            data = json.loads(text)
            events = tuple(Event(int(r), Action.parse(a), float(s), float(e), *(float(h) for h in host))
                           for r, a, s, e, *host in data["events"])
            n_ranks = int(data["n_ranks"])
            if n_ranks < 1:
                raise UserError(f"timeline JSON: n_ranks is {n_ranks}; it must be at least 1")
            for i, event in enumerate(events):
                if not 0 <= event.rank < n_ranks or not 0 <= event.start_s <= event.end_s < math.inf:
                    raise UserError(f"timeline JSON events[{i}] ({event.action}, rank {event.rank}, "
                                    f"{event.start_s} to {event.end_s} s): need a rank in 0..{n_ranks - 1} and "
                                    "finite times 0 <= start <= end")
            if not all(0 < x < math.inf for x in data.get("iterations_s", ())):
                raise UserError("timeline JSON: iterations_s must be finite times > 0")
            return cls(
                events=events,
                n_ranks=int(data["n_ranks"]),
                kind=str(data.get("kind", "predicted")),
                peak_activation_bytes=tuple(int(x) for x in data.get("peak_activation_bytes", ())),
                label=str(data.get("label", "")),
                iterations_s=tuple(float(x) for x in data.get("iterations_s", ())),
                prepost_bytes=tuple(int(x) for x in data.get("prepost_bytes", ())),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
            raise UserError(
                f"malformed timeline JSON ({e!r}); re-create it with `pipetrain simulate` or `pipetrain train`"
            ) from None

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        try:
            return cls.from_json(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"no timeline at {path}") from None
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
