"""Every ``torch.distributed.pipelining`` schedule the torch baseline runs, and how it is placed.

A schedule with one stage per rank (GPipe, 1F1B) runs the two-stage equal-layer split of
:func:`stage_layers`. A schedule with two virtual stages per rank cuts the model into 4 chunks:
the looping placement (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) puts chunks 0, 2 on
rank 0 and 1, 3 on rank 1; the V placement (ZBVZeroBubble, DualPipeV) puts 0, 3 on rank 0 and
1, 2 on rank 1. The chunk boundaries balance the ranks' parameter counts (a proxy of their compute
that needs no profile: every layer of the zoo's mlp and gpt-tiny is dominated by its matmuls),
ties broken by the most even chunks.

``allows`` encodes torch 2.13's checks on the micro-batch count for 2 ranks, so a benchmark grid
skips what torch refuses at build time (the refusal is stated in ``rule``); the torch baseline's
command line still runs whatever it is given and reports torch's own error.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["SCHEDULES", "TorchSchedule", "chunk_layers", "schedule_of", "stage_layers"]

Placement = Literal["loop", "v"]


def stage_layers(n_layers: int, stage: int, n_stages: int) -> range:
    """Layer indices of ``stage`` in the equal-layer split (the first stages get any extra layer)."""
    q, r = divmod(n_layers, n_stages)
    first = stage * q + min(stage, r)
    return range(first, first + q + (1 if stage < r else 0))


def _rounds_ok(n_micro: int, n_ranks: int) -> bool:
    """torch's flexible interleaving: ``m % max(1, m // ranks) == 0``."""
    return n_micro % max(1, n_micro // n_ranks) == 0


@dataclass(frozen=True)
class TorchSchedule:
    """One torch schedule as the baseline runs it.

    Attributes:
        name: the key used on command lines and in labels (``"gpipe"``, ``"zbv"``, ...).
        class_name: the class in ``torch.distributed.pipelining``.
        virtual: stages (model chunks) per rank.
        placement: ``"loop"`` (chunk k on rank k mod ranks) or ``"v"`` (0, 3 / 1, 2 on 2 ranks).
        rule: torch's requirement on the micro-batch count, in words.
        allowed: that requirement as a test of ``(n_micro, n_ranks)``.
    """

    name: str
    class_name: str
    virtual: int
    placement: Placement
    rule: str
    allowed: Callable[[int, int], bool]

    def n_stages(self, n_ranks: int) -> int:
        """Pipeline stages (model chunks) over ``n_ranks`` ranks."""
        return self.virtual * n_ranks

    def rank_stages(self, rank: int, n_ranks: int) -> tuple[int, ...]:
        """The stage indices ``rank`` holds, in increasing order."""
        if self.placement == "loop":
            return tuple(range(rank, self.n_stages(n_ranks), n_ranks))
        return (rank, 2 * n_ranks - 1 - rank)

    def allows(self, n_micro: int, n_ranks: int) -> bool:
        """Whether torch accepts ``n_micro`` micro-batches on ``n_ranks`` ranks."""
        return n_micro >= 1 and self.allowed(n_micro, n_ranks)

    @property
    def multi(self) -> bool:
        """Whether torch's class takes a list of stages (``PipelineScheduleMulti``)."""
        return self.virtual > 1

SCHEDULES: dict[str, TorchSchedule] = {s.name: s for s in (
    TorchSchedule("gpipe", "ScheduleGPipe", 1, "loop", "any m", lambda m, r: True),
    TorchSchedule("1f1b", "Schedule1F1B", 1, "loop", "m ≥ stages (2)", lambda m, r: m >= r),
    TorchSchedule("interleaved-1f1b", "ScheduleInterleaved1F1B", 2, "loop",
                  "m divisible by max(1, m // ranks)", _rounds_ok),
    TorchSchedule("looped-bfs", "ScheduleLoopedBFS", 2, "loop", "any m", lambda m, r: True),
    TorchSchedule("interleaved-zb", "ScheduleInterleavedZeroBubble", 2, "loop",
                  "m divisible by max(1, m // ranks)", _rounds_ok),
    TorchSchedule("zbv", "ScheduleZBVZeroBubble", 2, "v", "any m", lambda m, r: True),
    TorchSchedule("dualpipev", "ScheduleDualPipeV", 2, "v", "m ≥ stages (4)", lambda m, r: m >= 2 * r),
)}


def schedule_of(name: str) -> TorchSchedule:
    """The schedule called ``name``.

    Raises:
        ValueError: an unknown name.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}; choose one of: {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def chunk_layers(weights: Sequence[float], schedule: TorchSchedule, n_ranks: int) -> list[range]:
    """The layers of each stage (chunk) of ``schedule``: equal layers for one stage per rank,
    otherwise the contiguous cut whose ranks' summed ``weights`` are most even.

    Raises:
        ValueError: fewer layers than stages.
    """
    n, k = len(weights), schedule.n_stages(n_ranks)
    if n < k:
        raise ValueError(f"{n} layers cannot make {k} stages")
    if schedule.virtual == 1:
        return [stage_layers(n, s, k) for s in range(k)]
    owner = {s: r for r in range(n_ranks) for s in schedule.rank_stages(r, n_ranks)}
    best: tuple[tuple[float, float], list[range]] | None = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        chunks = [range(bounds[s], bounds[s + 1]) for s in range(k)]
        load = [0.0] * n_ranks
        for s, chunk in enumerate(chunks):
            load[owner[s]] += sum(weights[i] for i in chunk)
        score = (max(load), max(sum(weights[i] for i in c) for c in chunks))
        if best is None or score < best[0]:
            best = (score, chunks)
    assert best is not None
    return best[1]
