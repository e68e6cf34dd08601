"""The Core report's fidelity part: the simulator's predicted iteration against the measured one.

Beside the medians, two views of how much of the error is the machine's. A shared machine runs in
regimes (within one run of 22 steps a step can sit at 58 ms for ten steps and at 77 ms for the
next ten, as other tenants come and go), and the simulator predicts an undisturbed machine, so:

* the error against each run's *fastest quartile* of timed steps (the least disturbed steps);
* a noise floor: pipetrain ``gpipe m=1`` and ``1f1b m=1`` are the same program on two stages (one
  micro-batch: forward down, backward up), so their measured ratio is the run-to-run noise alone.

Then the ranking: Kendall's tau-b between predicted and measured iterations over a model's pipetrain
settings, and how far the predicted best measured from the measured best.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from harness import Chart, Row, kendall_tau_b

__all__ = ["Fidelity", "scatter_chart"]

_TWINS = ("pipetrain gpipe m=1", "pipetrain 1f1b m=1")


def _ranked(row: Row) -> bool:
    """A pipetrain run whose prediction is the plan's own (planned-noalloc runs without the allocator
    setting the prediction assumes)."""
    label: str = row["label"]
    return label.startswith(("pipetrain", "planned")) and label != "planned-noalloc"


def _medians(runs: Sequence[Row], key: str = "iteration_s") -> dict[tuple[str, str], tuple[float, float]]:
    """(model, label) -> (median measured ``key`` over its runs, predicted) for the ranked settings."""
    by: dict[tuple[str, str], list[float]] = {}
    predicted: dict[tuple[str, str], float] = {}
    for r in runs:
        if _ranked(r) and r.get(key) and r["predicted_s"]:
            by.setdefault((r["model"], r["label"]), []).append(r[key])
            predicted[(r["model"], r["label"])] = r["predicted_s"]
    return {k: (statistics.median(v), predicted[k]) for k, v in by.items()}


class Fidelity:
    """The fidelity figures of a run's rows: per-setting errors, tau-b per model, and its markdown."""

    def __init__(self, runs: Sequence[Row], models: Sequence[str], warmup: int) -> None:
        self.medians = _medians(runs)
        self.errors = {k: p / m - 1 for k, (m, p) in self.medians.items()}
        self.tau = {model: self._tau(model) for model in models}
        self.lines = self._lines(runs, models, warmup)

    def _tau(self, model: str) -> float:
        mine = [v for k, v in self.medians.items() if k[0] == model]
        return kendall_tau_b([m for m, _ in mine], [p for _, p in mine])

    def _lines(self, runs: Sequence[Row], models: Sequence[str], warmup: int) -> list[str]:
        if not self.errors:
            return ["No pipetrain run finished: no prediction to compare."]
        abs_errors = [abs(e) for e in self.errors.values()]
        per_run = [abs(r["predicted_s"] / r["iteration_s"] - 1) for r in runs
                   if _ranked(r) and r["predicted_s"] and r["iteration_s"]]
        lines = [f"Over {len(abs_errors)} pipetrain configurations (predicted vs median measured iteration): "
                 f"median |error| {statistics.median(abs_errors):.1%} (target ≤ 10%), worst {max(abs_errors):.1%} "
                 f"(target ≤ 20%). Per individual run ({len(per_run)} runs): median |error| "
                 f"{statistics.median(per_run):.1%}, worst {max(per_run):.1%}.", _quiet_line(runs, warmup), ""]
        lines += [_noise_line(runs, model) for model in models]
        return [*lines, "", *(self._ranking_line(model) for model in models)]

    def _ranking_line(self, model: str) -> str:
        """Does the simulator rank pipetrain's settings as they measured (tau-b target ≥ 0.8; the
        predicted best within 5% of the measured best)?"""
        mine = [(m, p, k[1]) for k, (m, p) in self.medians.items() if k[0] == model]
        if math.isnan(self.tau[model]):
            return f"- {model}: too few measured settings to rank"
        best, top = min(mine), min(mine, key=lambda x: x[1])
        return (f"- {model}: ranking of {len(mine)} settings, Kendall tau-b {self.tau[model]:+.2f} (target ≥ 0.8); "
                f"the predicted best ({top[2]}) measured {top[0] / best[0] - 1:+.1%} from the measured best "
                f"({best[2]}) (target within 5%)")


def _quartile(steps: Sequence[float]) -> float:
    return statistics.quantiles(steps, n=4)[0] if len(steps) >= 2 else steps[0]


def _quiet_line(runs: Sequence[Row], warmup: int) -> str:
    """Median and worst ``|predicted − fastest quartile| / fastest quartile`` over pipetrain's settings."""
    quiet = [{**r, "quiet_s": _quartile(r["step_times_s"][warmup:])} for r in runs if r["step_times_s"][warmup:]]
    errors = {k: p / m - 1 for k, (m, p) in _medians(quiet, "quiet_s").items()}
    if not errors:
        return "Against the fastest quartile of steps: no timed pipetrain runs."
    worst = max(errors, key=lambda k: abs(errors[k]))
    return (f"Against each run's fastest quartile of timed steps (the least disturbed): median |error| "
            f"{statistics.median(abs(e) for e in errors.values()):.1%}, worst {abs(errors[worst]):.1%} "
            f"({worst[0]} {worst[1]}).")


def _noise_line(runs: Sequence[Row], model: str) -> str:
    """The measured ratio of two settings that run the same program: the benchmark's noise floor."""
    medians = []
    for label in _TWINS:
        its = [r["iteration_s"] for r in runs if r["model"] == model and r["label"] == label and r["iteration_s"]]
        if not its:
            return f"- {model}: noise floor not measured ({label} did not run)"
        medians.append(statistics.median(its))
    return (f"- {model}: {_TWINS[0]} and {_TWINS[1]} run the same program; measured "
            f"{medians[0] * 1e3:.1f} vs {medians[1] * 1e3:.1f} ms ({medians[0] / medians[1] - 1:+.1%}): "
            f"the noise floor of one configuration's median")


def scatter_chart(f: Fidelity, model: str) -> Chart:
    """Predicted against measured iteration (ms) of each of ``model``'s pipetrain settings; the planned
    setting and the worst predicted are named (the rest are too close together to read)."""
    mine = {k[1]: v for k, v in f.medians.items() if k[0] == model}
    worst = max(mine, key=lambda label: abs(mine[label][1] / mine[label][0] - 1), default="")
    points = tuple((m * 1e3, p * 1e3, label.removeprefix("pipetrain ") if label in ("planned", worst) else "")
                   for label, (m, p) in mine.items())
    return Chart("fidelity", f"fidelity-{model}", f"{model}: predicted against measured iteration (ms)", "scatter",
                 "predicted (ms)", "measured (ms, median over rounds)", points=points)
