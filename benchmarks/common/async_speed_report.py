"""async-speed's report: measured and predicted samples/s per model and method, paired against 1f1b."""

from __future__ import annotations

import statistics

from harness import Chart, Headline, Report, Row, RunInfo, ratio

__all__ = ["report"]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _paired(rows: list[Row], method: str) -> float | None:
    """The median over rounds of ``method``'s samples/s over 1f1b's in the same round (the machine's load
    drifts between rounds; within a round the runs are adjacent)."""
    speed = {(r["round"], r["method"]): r["samples_per_s"] for r in rows if r["samples_per_s"]}
    return _median([v / speed[(k, "1f1b")] for (k, m), v in speed.items() if m == method and (k, "1f1b") in speed])


def report(rows: list[Row], info: RunInfo) -> Report:
    """Per model and method: measured (median over rounds) and predicted samples/s, each relative to 1f1b."""
    lines = ["Samples/s: batch / median timed step, median over rounds.", "",
             "| model | method | measured samples/s | vs 1f1b (paired) | predicted samples/s | vs 1f1b | "
             "measured / predicted | runs ok |", "|---|---|---|---|---|---|---|---|"]
    headlines, points, series = [], [], {}
    models = list(dict.fromkeys(r["model"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        predicted = {r["method"]: r["predicted_samples_per_s"] for r in mine}
        errors = []
        for m in methods:
            runs = [r for r in mine if r["method"] == m]
            got, want = _median([r["samples_per_s"] for r in runs if r["samples_per_s"]]), predicted[m]
            paired = _paired(mine, m)
            ok = sum(r["status"] == "ok" for r in runs)
            lines.append(f"| {model} | {m} | {'—' if got is None else f'{got:.1f}'} | "
                         f"{'—' if paired is None else f'{paired:.2f}×'} | {want:.1f} | "
                         f"{ratio(want, predicted['1f1b'])} | {ratio(got, want)} | {ok}/{len(runs)} |")
            series.setdefault(m, []).append(paired)
            if got is not None:
                errors.append(100 * abs(want / got - 1))
                points.append((got, want, f"{model} {m}"))
        steps, rounds = mine[0]["steps"], len({r["round"] for r in mine})
        headlines.append(Headline("fidelity", f"{model}: predicted samples/s against measured, median error over "
                                  "gpipe, 1f1b, pipedream and 2bw", _median(errors), unit="%",
                                  config=f"measured, 2 CPU ranks, {rounds} round{'s' * (rounds > 1)} of "
                                         f"{steps} steps"))
    charts = (Chart("fidelity", "predicted", "Asynchronous methods: predicted against measured samples/s", "scatter",
                    "predicted samples/s", "measured samples/s", points=tuple(points)),
              Chart("methods", "vs-1f1b", "Measured samples/s against 1f1b in the same round (paired)", "bars",
                    "× 1f1b", categories=tuple(models), series=tuple((m, tuple(v)) for m, v in series.items())))
    return Report("\n".join(lines), tuple(headlines), charts)
