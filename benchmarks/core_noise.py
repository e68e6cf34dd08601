"""How much of the Core benchmark's prediction error is the machine's: two views beside the medians.

A shared machine runs in regimes: within one run of 22 steps a configuration's step time can sit at
58 ms for ten steps and at 77 ms for the next ten (gpt-tiny single-process training, 2026-11-25), as
other tenants come and go. The simulator predicts an undisturbed machine, so the report adds

* the error against each run's *fastest quartile* of timed steps (the 25th percentile, the median over
  rounds), the steps least disturbed, beside the error against the median step;
* a noise floor: pipetrain ``gpipe m=1`` and ``1f1b m=1`` are the same program on two stages (one
  micro-batch: forward down, backward up), so their measured ratio is the run-to-run noise alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench_core import Run

__all__ = ["identical_programs_line", "quiet_error_line"]

_TWINS = ("pipetrain gpipe m=1", "pipetrain 1f1b m=1")


def _quartile(steps: Sequence[float]) -> float:
    return statistics.quantiles(steps, n=4)[0] if len(steps) >= 2 else steps[0]


def quiet_error_line(runs: Sequence[Run], warmup: int) -> str:
    """Median and worst ``|predicted − fastest quartile| / fastest quartile`` over pipetrain's settings."""
    quiet: dict[tuple[str, str], list[float]] = {}
    predicted: dict[tuple[str, str], float] = {}
    for r in runs:
        timed = r.step_times_s[warmup:]
        if r.label.startswith(("pipetrain", "planned")) and r.label != "planned-noalloc" and timed and r.predicted_s:
            quiet.setdefault((r.model, r.label), []).append(_quartile(timed))
            predicted[(r.model, r.label)] = r.predicted_s
    if not quiet:
        return "Against the fastest quartile of steps: no timed pipetrain runs."
    errors = {k: predicted[k] / statistics.median(v) - 1 for k, v in quiet.items()}
    worst = max(errors, key=lambda k: abs(errors[k]))
    return (f"Against each run's fastest quartile of timed steps (the least disturbed; module "
            f"benchmarks/core_noise.py): median |error| {statistics.median(abs(e) for e in errors.values()):.1%}, "
            f"worst {abs(errors[worst]):.1%} ({worst[0]} {worst[1]}).")


def identical_programs_line(runs: Sequence[Run], model: str) -> str:
    """The measured ratio of two settings that run the same program: the benchmark's noise floor."""
    medians = []
    for label in _TWINS:
        its = [r.iteration_s for r in runs if r.model == model and r.label == label and r.iteration_s]
        if not its:
            return f"- {model}: noise floor not measured ({label} did not run)"
        medians.append(statistics.median(its))
    return (f"- {model}: {_TWINS[0]} and {_TWINS[1]} run the same program; measured "
            f"{medians[0] * 1e3:.1f} vs {medians[1] * 1e3:.1f} ms ({medians[0] / medians[1] - 1:+.1%}): "
            f"the noise floor of one configuration's median")
