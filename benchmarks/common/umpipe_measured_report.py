"""The report of ``bench_umpipe_measured.py`` (UMPIPE 7(c)): per model a table of every configuration
against the best equal plan and the best torch schedule, the headlines with BENCHMARKS.md "UMPIPE
(c)"'s targets (tidgap ≥ 1.10× the best equal plan; prediction error ≤ 10%), and the charts.

Rows are :func:`common.zb_measured.train_cases`'s (pipetrain, with ``sizes`` per stage [forward,
backward]) and torch's (label ``torch <schedule> m=<n>``, no prediction)."""

from __future__ import annotations

import statistics

from harness import Chart, Headline, Report, Row, Target, ratio

from common.zb_measured import median_rate

__all__ = ["EQUAL", "umpipe_measured_report"]

EQUAL = ("gpipe", "1f1b", "zb1")


def _sizes(row: Row) -> str:
    if not row.get("sizes"):
        return "—"
    parts = []
    for k, (forward, backward) in enumerate(row["sizes"]):
        text = "[" + ",".join(map(str, forward)) + "]"
        if backward != forward:
            text += " / B [" + ",".join(map(str, backward)) + "]"
        parts.append(f"stage {k}: {text}")
    return "; ".join(parts)


def _error(rows: list[Row]) -> float | None:
    """(predicted − measured) / measured iteration time, %, of the median measured step."""
    measured = [r["iteration_s"] for r in rows if r["iteration_s"]]
    predicted = rows[0]["predicted_s"]
    if not measured or not predicted:
        return None
    return 100 * (predicted - statistics.median(measured)) / statistics.median(measured)


def umpipe_measured_report(rows: list[Row], batches: dict[str, int]) -> Report:
    """Tables, headlines and charts of every model in ``rows`` (``batches``: each model's batch)."""
    lines, headlines, errors, points = [], [], [], []
    labels = list(dict.fromkeys(r["label"] for r in rows))
    normalised: dict[str, list[float | None]] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {label: [r for r in rows if r["model"] == model and r["label"] == label] for label in labels}
        sps = {label: median_rate(rs) for label, rs in by.items()}
        equal = max((sps[k] or 0.0, k) for k in EQUAL if by.get(k))
        torch = max(((sps[k] or 0.0, k) for k in labels if k.startswith("torch") and by[k]), default=(None, "none run"))
        lines += [f"## {model}, batch {batches.get(model, '?')}", "",
                  f"Best equal plan: **{equal[1]}** ({_sizes(by[equal[1]][0])}); best torch: **{torch[1]}**.", "",
                  "| configuration | samples/s (median) | min–max | × best equal | × best torch | measured ms "
                  "| predicted ms | pred. error | runs ok |", "|---|---|---|---|---|---|---|---|---|"]
        for label, rs in by.items():
            ok = [r["samples_per_s"] for r in rs if r["samples_per_s"]]
            if not ok:
                lines.append(f"| {label} | — | {rs[0]['status'] if rs else 'not run'} | | | | | | 0 |")
                continue
            measured = statistics.median(r["iteration_s"] for r in rs if r["iteration_s"])
            predicted, error = rs[0]["predicted_s"], _error(rs)
            if error is not None:
                errors.append(error)
                points.append((batches.get(model, 0) / predicted, sps[label] or 0.0, f"{model} {label}"))
            lines.append(f"| {label} | {sps[label]:.1f} | {min(ok):.0f}–{max(ok):.0f} | "
                         f"{ratio(sps[label], equal[0])} | "
                         f"{ratio(sps[label], torch[0])} | {1e3 * measured:.2f} | "
                         f"{'' if predicted is None else f'{1e3 * predicted:.2f}'} | "
                         f"{'' if error is None else f'{error:+.1f}%'} | {len(ok)} |")
        lines.append("")
        for planner in ("tidgap", "1f1b-ga"):
            if by.get(planner):
                gain = by[equal[1]][0]["predicted_s"] / by[planner][0]["predicted_s"]
                lines.append(f"- {planner}: {_sizes(by[planner][0])}; predicted gain over best equal {gain:.3f}×, "
                             f"measured {ratio(sps[planner], equal[0])}")
        lines.append("")
        config = f"2 local CPU ranks, {model}, batch {batches.get(model, '?')}"
        tidgap = sps["tidgap"] / equal[0] if sps.get("tidgap") and equal[0] else None  # None: not run
        headlines.append(Headline("methods", f"UMPIPE measured, {model}: tidgap over the best equal plan ({equal[1]})",
                                  tidgap, target=Target(">=", 1.10), config=config))
        if torch[0]:
            best = max((sps[k] or 0.0, k) for k in labels if not k.startswith("torch") and by[k])
            headlines.append(Headline("torch", f"{model}: pipetrain's best ({best[1]}) over torch's best ({torch[1]})",
                                      best[0] / torch[0], config=config))
        normalised[model] = [None if not sps[k] or not equal[0] else sps[k] / equal[0] for k in labels]  # type: ignore[operator]
    if errors:
        headlines.append(Headline("fidelity", "UMPIPE measured: prediction error of iteration time, median absolute",
                                  statistics.median(abs(e) for e in errors), unit="%", target=Target("abs<=", 10),
                                  config="2 local CPU ranks, measured profile"))
    area = "torch" if any(k.startswith("torch") for k in labels) else "methods"
    charts = [Chart(area, "configurations", "Measured samples/s over the best equal plan, 2 local ranks", "bars",
                    "× best equal plan", categories=tuple(labels),
                    series=tuple((m, tuple(v)) for m, v in normalised.items())),
              Chart("fidelity", "predicted", "Predicted against measured samples/s (pipetrain's plans)", "scatter",
                    "measured samples/s", x_label="predicted samples/s", points=tuple(points))]
    return Report("\n".join(lines), tuple(headlines), tuple(charts))
