"""How steady a measured profile's timings were, and how loaded the machine was (issue 32).

The profiler keeps the median of ``repeats`` timed runs of every quantity it times
(:mod:`.timing`). Each median also gets a **relative spread**: half the interquartile range of its
runs over their median (:func:`relative_spread`), so a spread of 0.1 reads "±10%". Quartiles, not
the extremes, because one slow run among five (a page fault, another process's burst) moves the
median little and should not count as noise.

A measurement whose spread exceeds :data:`UNSTABLE_SPREAD` is timed again, up to
:data:`EXTRA_ROUNDS` more rounds of ``repeats`` runs, and the steadiest round is kept
(:func:`steadiest`): a burst of load usually passes. Over the whole profile, :class:`ProfileNoise`
summarises the spreads weighted by each measurement's seconds (a jittery 50 µs layer norm matters
less than a steady 5 ms block), with the machine's load average at the start and the end.

Its ``spread`` is the 90th percentile, not the median, of those spreads: load comes in bursts
longer than one round of runs, so a round can be steady and still off, and the medians of the same
layer measured twice on a busy machine differ by more than a typical round spreads (on a 2-core
machine shared with other jobs: rounds spread ±3–6% at the median, ±5–20% at the 90th percentile,
and the best plans' predicted times moved by about 10% between profiles). When ``spread`` still
exceeds the threshold, :func:`noise_warning` says so in one line; the planner treats plans whose
predicted times differ by less than it as equal (:mod:`pipetrain.planners.noise`).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipetrain.errors import UserError

__all__ = ["EXTRA_ROUNDS", "UNSTABLE_SPREAD", "NoiseLog", "ProfileNoise", "load_average", "noise_warning",
           "relative_spread", "steadiest"]

UNSTABLE_SPREAD = 0.10
"""A measurement (and a profile) is unstable above this relative spread (±10%)."""

EXTRA_ROUNDS = 2
"""At most this many more rounds of ``repeats`` runs for an unstable measurement."""


def relative_spread(samples: Sequence[float]) -> float:
    """Half the interquartile range of ``samples`` over their median (0 for fewer than 2 samples or
    a median of 0).

    >>> relative_spread([1.0, 1.2, 0.9, 0.8, 1.1])
    0.1
    """
    median = statistics.median(samples) if samples else 0.0
    if len(samples) < 2 or median <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return round((q3 - q1) / (2 * median), 12)


def steadiest(round_of: Callable[[int], Sequence[float]], threshold: float = UNSTABLE_SPREAD,
              extra_rounds: int = EXTRA_ROUNDS) -> tuple[float, float, int]:
    """The median and relative spread of the steadiest of up to ``1 + extra_rounds`` rounds of
    samples, and how many rounds ran: ``round_of(i)`` gives round ``i`` (from 0), called again while
    the latest round's spread exceeds ``threshold``. Ties between rounds keep the earlier one."""
    best = (math.inf, math.inf)
    rounds = 0
    while rounds <= extra_rounds:
        samples = round_of(rounds)
        rounds += 1
        spread = relative_spread(samples)
        if spread < best[1]:
            best = (statistics.median(samples), spread)
        if spread <= threshold:
            break
    return best[0], best[1], rounds


@dataclass
class NoiseLog:
    """What a profiler's timer has measured so far: per measurement, its median seconds and relative
    spread (:func:`steadiest`), and how many measurements needed more rounds."""

    seconds: list[float] = field(default_factory=list)
    spreads: list[float] = field(default_factory=list)
    retimed: int = 0

    def add(self, seconds: float, spread: float, retimed: bool) -> None:
        self.seconds.append(seconds)
        self.spreads.append(spread)
        self.retimed += retimed


def load_average() -> float | None:
    """The machine's one-minute load average (runnable processes), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` of the total (equal weights when
    every weight is 0)."""
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in pairs)
    if total <= 0:
        pairs = [(v, 1.0) for v, _ in pairs]
        total = len(pairs)
    reached = 0.0
    for value, weight in pairs:
        reached += weight
        if reached >= q * total:
            return value
    return pairs[-1][0]


@dataclass(frozen=True)
class ProfileNoise:
    """How steady a measured profile's timings were (module docstring).

    Attributes:
        spread: the 90th percentile of the measurements' relative spreads (half their interquartile
            range over their median), weighted by their seconds: 0.12 says 90% of the profiled
            seconds were measured within ±12% (module docstring).
        median_spread: the weighted median of the same.
        measurements: how many quantities were timed.
        retimed: how many of them were unstable and timed again (:data:`EXTRA_ROUNDS`).
        repeats: timed runs per round.
        load_start, load_end: the one-minute load average when profiling began and ended (None: the
            OS reports none).
        cpus: the machine's logical CPUs (``os.cpu_count()``; None: unknown).
    """

    spread: float
    median_spread: float
    measurements: int
    retimed: int
    repeats: int
    load_start: float | None = None
    load_end: float | None = None
    cpus: int | None = None

    @classmethod
    def summarise(cls, log: NoiseLog, repeats: int, load_start: float | None, load_end: float | None,
                  cpus: int | None) -> ProfileNoise:
        """The summary of a profiler's :class:`NoiseLog` (no measurement: spreads of 0)."""
        if not log.spreads:
            return cls(0.0, 0.0, 0, 0, repeats, load_start, load_end, cpus)
        return cls(
            spread=_weighted_quantile(log.spreads, log.seconds, 0.9),
            median_spread=_weighted_quantile(log.spreads, log.seconds, 0.5),
            measurements=len(log.spreads), retimed=log.retimed, repeats=repeats,
            load_start=load_start, load_end=load_end, cpus=cpus,
        )

    @property
    def unstable(self) -> bool:
        return self.spread > UNSTABLE_SPREAD

    def load_text(self) -> str:
        """``load 2.8 on 2 cores`` (the higher of the start and end loads), or ``""`` when unknown."""
        loads = [x for x in (self.load_start, self.load_end) if x is not None]
        if not loads:
            return ""
        cores = "" if self.cpus is None else f" on {self.cpus} core{'' if self.cpus == 1 else 's'}"
        return f"load {max(loads):.1f}{cores}"

    def describe(self) -> str:
        """One line: ``timings within ±6% for 90% of the profiled time (median ±2%; 12 of 168 timed
        again; load 2.4 on 2 cores)``."""
        load = self.load_text()
        return (f"timings within ±{self.spread:.0%} for 90% of the profiled time (median ±{self.median_spread:.0%}; "
                f"{self.retimed} of {self.measurements} timed again{f'; {load}' if load else ''})")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileNoise:
        """From a profile file's ``noise`` object; a UserError for a spread or count out of range."""
        def optional(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        noise = cls(spread=float(data["spread"]), median_spread=float(data["median_spread"]),
                    measurements=int(data["measurements"]), retimed=int(data.get("retimed", 0)),
                    repeats=int(data["repeats"]), load_start=optional("load_start"), load_end=optional("load_end"),
                    cpus=None if data.get("cpus") is None else int(data["cpus"]))
        if not (0 <= noise.median_spread <= noise.spread < math.inf) or min(noise.measurements, noise.retimed) < 0:
            raise UserError(f"profile JSON noise: median_spread {noise.median_spread} and spread {noise.spread} "
                            "must be finite with 0 <= median_spread <= spread, and the counts >= 0; re-create it "
                            "with `pipetrain profile`")
        return noise


def noise_warning(noise: ProfileNoise | None) -> str | None:
    """One line when the profile's timings are unstable (:attr:`ProfileNoise.unstable`), else None."""
    if noise is None or not noise.unstable:
        return None
    load = noise.load_text()
    return (f"timings vary by ±{noise.spread:.0%}{f' ({load})' if load else ''} even after timing "
            f"{noise.retimed} of {noise.measurements} measurements again: predictions may be off by as much; "
            f"profile on a quieter machine or with more repeats (`pipetrain profile --repeats "
            f"{max(2 * noise.repeats, 10)}`, then --profile FILE)")
