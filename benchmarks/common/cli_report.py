"""The CLI-flow benchmark's report, from its rows only (so ``--rereport`` redraws a stored run).

A row is one model in one mode: the plans of three ``plan`` runs (``plans``, ``planned_ms``,
``noise_lines``: what ``plan`` said about noise), the predicted iteration (``predicted_ms``,
``simulate``'s timeline), the measured one (``measured_ms``: the median over ``measured_runs_ms``,
each training's median step), ``iteration_error`` (predicted / measured − 1) and per action kind
the mean predicted and measured ms and their error (``kinds``). Targets (issue 32): the iteration
within ±15% uncalibrated and ±10% calibrated; every action kind's mean within ±25%.
"""

from __future__ import annotations

from harness import Chart, Headline, Report, Row, RunInfo, Target

__all__ = ["ITERATION_TARGET", "KIND_TARGET", "cli_report"]

ITERATION_TARGET = {"uncalibrated": 0.15, "calibrated": 0.10}
KIND_TARGET = 0.25


def _iteration_table(rows: list[Row]) -> list[str]:
    lines = ["| model | mode | plan (3 runs of `plan`) | same plan? | predicted ms | measured ms (median; runs) "
             "| error | target |", "|---|---|---|---|---:|---:|---:|---|"]
    for row in rows:
        plans = row["plans"]
        same = "yes" if len(set(plans)) == 1 else ("within noise (said)" if row["noise_lines"] else "**no**")
        target, error = ITERATION_TARGET[row["mode"]], row["iteration_error"]
        runs = ", ".join(f"{ms:.1f}" for ms in row["measured_runs_ms"])
        lines.append(f"| {row['model']} | {row['mode']} | {'; '.join(dict.fromkeys(plans))} | {same} | "
                     f"{row['predicted_ms']:.2f} | {row['measured_ms']:.2f} ({runs}) | {error:+.1%} | "
                     f"{'met' if abs(error) <= target else 'missed'} (±{target:.0%}) |")
    return lines


def _kinds_table(rows: list[Row]) -> list[str]:
    kinds = sorted({kind for row in rows for kind in row["kinds"]})
    lines = ["| model | mode | " + " | ".join(kinds) + " |", "|---|---|" + "---:|" * len(kinds)]
    for row in rows:
        by_kind = row["kinds"]
        cells = [f"{by_kind[k]['predicted_ms']:.2f}/{by_kind[k]['measured_ms']:.2f} ({by_kind[k]['error']:+.0%})"
                 if k in by_kind else "" for k in kinds]
        lines.append(f"| {row['model']} | {row['mode']} | " + " | ".join(cells) + " |")
    errors = [k["error"] for row in rows for k in row["kinds"].values()]
    within = sum(abs(e) <= KIND_TARGET for e in errors)
    return [*lines, "", f"Action kinds: mean ms predicted/measured (signed error); target: every kind within "
                        f"±{KIND_TARGET:.0%}: {within} of {len(errors)} are."]


def cli_report(rows: list[Row], info: RunInfo) -> Report:
    """The iteration and action-kind tables; per model and mode the iteration's error as a headline
    with its target; predicted against measured iterations as a scatter."""
    headlines = tuple(
        Headline("fidelity", f"CLI flow, {row['mode']}: predicted vs measured iteration, {row['model']}",
                 100 * row["iteration_error"], unit="%", target=Target("abs<=", 100 * ITERATION_TARGET[row["mode"]]),
                 config=f"plan → simulate → train ({len(row['measured_runs_ms'])}×, median) on 2 local ranks, "
                        "--optimizer adamw, default batch")
        for row in rows)
    chart = Chart("fidelity", "iteration", "The everyday CLI flow: predicted against measured iteration (ms)",
                  "scatter", "predicted ms", x_label="measured ms",
                  points=tuple((row["measured_ms"], row["predicted_ms"],
                                f"{row['model']} ({'cal' if row['mode'] == 'calibrated' else 'uncal'})")
                               for row in rows))
    return Report("\n".join([*_iteration_table(rows), "", *_kinds_table(rows)]) + "\n", headlines, (chart,))
