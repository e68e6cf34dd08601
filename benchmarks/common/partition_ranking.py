"""The report of planner-measured: per model, the predicted and measured rankings of the kept plans,
Kendall's tau-b between them, whether the predicted best is the measured best and each plan's
prediction error; the headlines are tau-b and the measured gap of the predicted best (issue 17's
targets: tau-b ≥ 0.8, gap ≤ 5%)."""

from __future__ import annotations

import statistics
from typing import Any

from harness import Chart, Headline, Report, Row, RunInfo, Target, kendall_tau_b

from common.measured import WARMUP_STEPS

__all__ = ["ranking_report"]


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.2f}"


def _plans(rows: list[Row]) -> list[dict[str, Any]]:
    """One entry per plan, predicted fastest first: medians over its launches (``step_s``: measured
    seconds per step, ``spread``: lowest and highest, ``n_ok``: launches that finished)."""
    labels = sorted(dict.fromkeys(r["label"] for r in rows), key=lambda k: next(r["predicted_s"] for r in rows
                                                                                 if r["label"] == k))
    out = []
    for label in labels:
        mine = [r for r in rows if r["label"] == label]
        steps = [r["step_s"] for r in mine if r["step_s"]]
        timelines = [r["timeline_s"] for r in mine if r["timeline_s"]]
        step_s = statistics.median(steps) if steps else None
        out.append({"label": label, "sources": mine[0]["sources"], "predicted_s": mine[0]["predicted_s"],
                    "step_s": step_s, "spread": (min(steps), max(steps)) if steps else None,
                    "timeline_s": statistics.median(timelines) if timelines else None, "n_ok": len(steps),
                    "error": None if step_s is None else (mine[0]["predicted_s"] - step_s) / step_s})
    return out


def _facts(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Kendall's tau-b, the predicted and measured best, the gap between them, the errors."""
    measured = [p for p in plans if p["step_s"] is not None]
    if not measured:
        return {"measured_plans": 0}
    predicted_best = min(measured, key=lambda p: p["predicted_s"])
    measured_best = min(measured, key=lambda p: p["step_s"])
    errors = [abs(p["error"]) for p in measured]
    return {"measured_plans": len(measured),
            "kendall_tau_b": kendall_tau_b([p["predicted_s"] for p in measured], [p["step_s"] for p in measured]),
            "predicted_best": predicted_best["label"], "measured_best": measured_best["label"],
            "gap": predicted_best["step_s"] / measured_best["step_s"] - 1.0,
            "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors)}


def _model_lines(model: str, first: Row, plans: list[dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    ranked = sorted((p for p in plans if p["step_s"]), key=lambda p: p["step_s"])
    rank = {p["label"]: k + 1 for k, p in enumerate(ranked)}
    lines = [f"## {model}, batch {first['batch']}", "",
             f"{first['n_candidates']} distinct candidate plans; {len(plans)} kept and run, "
             f"{first['steps'] - WARMUP_STEPS} timed steps each after {WARMUP_STEPS} warm-up; cluster: "
             f"{first['cluster']}. `*`: the planner's own choice.", "",
             "| pred. rank | meas. rank | plan | proposed by | predicted ms | measured ms (median) | min–max "
             "| pred. error | launches |", "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for k, p in enumerate(plans):
        spread = f"{_ms(p['spread'][0])}–{_ms(p['spread'][1])}" if p["spread"] else "failed"
        error = "—" if p["error"] is None else f"{p['error']:+.1%}"
        lines.append(f"| {k + 1} | {rank.get(p['label'], '—')} | {p['label']} | {', '.join(p['sources'])} | "
                     f"{_ms(p['predicted_s'])} | {_ms(p['step_s'])} | {spread} | {error} | {p['n_ok']} |")
    if facts["measured_plans"]:
        same = facts["predicted_best"] == facts["measured_best"]
        lines += ["", f"- Kendall's tau-b (predicted vs measured order, {facts['measured_plans']} plans): "
                      f"**{facts['kendall_tau_b']:+.2f}**",
                  f"- predicted best **{facts['predicted_best']}** is {'' if same else 'NOT '}the measured best"
                  + ("" if same else f" (**{facts['measured_best']}**)") + f"; measured gap {facts['gap']:+.1%}",
                  f"- prediction error: median |error| {facts['median_abs_error']:.1%}, "
                  f"worst {facts['worst_abs_error']:.1%}"]
    return [*lines, ""]


def ranking_report(rows: list[Row], info: RunInfo) -> Report:
    """Per model: the rankings table and its facts; headlines tau-b and the gap; predicted against measured."""
    lines = [f"{info.repeats} launches per model (order reversed every other one), gloo, one thread per rank. "
             "Measured ms: the median over launches of each run's median timed step. Error: (predicted − "
             "measured) / measured. Gap: measured time of the predicted best over that of the measured best, − 1.",
             ""]
    headlines: list[Headline] = []
    points = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        plans = _plans(mine)
        facts = _facts(plans)
        lines += _model_lines(model, mine[0], plans, facts)
        config = f"measured, 2 local ranks (gloo), {len(plans)} plans, batch {mine[0]['batch']}"
        measured = facts["measured_plans"] > 0
        headlines += [
            Headline("fidelity", f"{model}: Kendall's tau-b, predicted against measured order of the plans",
                     facts["kendall_tau_b"] if measured else None, unit="", target=Target(">=", 0.8), config=config),
            Headline("fidelity", f"{model}: the predicted best plan measured against the measured best (gap)",
                     100 * facts["gap"] if measured else None, unit="%", target=Target("<=", 5.0), config=config)]
        points += [(1e3 * p["step_s"], 1e3 * p["predicted_s"], f"{model} {p['label']}") for p in plans if p["step_s"]]
    chart = Chart("fidelity", "predicted", "Planners' candidates: predicted against measured ms per step", "scatter",
                  "predicted ms", x_label="measured ms", points=tuple(points))
    return Report("\n".join(lines), tuple(headlines), (chart,) if points else ())
