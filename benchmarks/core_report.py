"""The Core benchmark's report: per-model tables, targets and Gantt pictures (benchmarks/bench_core.py).

``write_report(bench)`` renders ``core.md`` from the runs; ``save_gantts(bench)`` draws the planned
setting's predicted beside its median measured run. Kept apart from the runner so a finished run can
be re-rendered (benchmarks/core_rerender.py) without importing the rounds' machinery twice.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core_noise import identical_programs_line, quiet_error_line
from core_torch_report import micro_of, torch_schedule_lines
from ranking import kendall_tau_b

from pipetrain.fileio import write_atomic

if TYPE_CHECKING:
    from bench_core import Bench, ModelSetup, Run

    from pipetrain.plan.plan import Plan

__all__ = ["Summary", "describe", "model_report", "ranking_line", "ratio", "save_gantts", "summarize",
           "write_report"]


def describe(plan: Plan) -> str:
    """``"1f1b m=3 layers [4, 4]"``: a plan's method, micro-batch count and layers per stage."""
    sizes = plan.stages[0].forward_sizes
    return f"{plan.method.value} m={len(sizes)} layers {[len(s.layers) for s in plan.stages]}"


@dataclass(frozen=True)
class Summary:
    """One configuration's medians over rounds."""

    label: str
    samples_per_s: float | None
    spread: tuple[float, float] | None
    iteration_s: float | None
    predicted_s: float | None
    n_ok: int
    status: str

    @property
    def error(self) -> float | None:
        known = self.predicted_s is not None and self.iteration_s is not None
        return (self.predicted_s - self.iteration_s) / self.iteration_s if known else None  # type: ignore[operator]


def summarize(runs: Sequence[Run], label: str) -> Summary:
    mine = [r for r in runs if r.label == label]
    ok = [r for r in mine if r.status == "ok" and r.samples_per_s and r.iteration_s]
    if not ok:
        return Summary(label, None, None, None, mine[0].predicted_s if mine else None, 0,
                       mine[0].status if mine else "not run")
    sps = [r.samples_per_s for r in ok if r.samples_per_s]
    its = [r.iteration_s for r in ok if r.iteration_s]
    return Summary(label, statistics.median(sps), (min(sps), max(sps)), statistics.median(its),
                   ok[0].predicted_s, len(ok), "ok")


def _fmt(x: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "—" if x is None else f"{x * scale:{spec}}{suffix}"


def model_report(setup: ModelSetup, runs: Sequence[Run], labels: Sequence[str]) -> tuple[list[str], list[float]]:
    """Markdown lines for one model and the prediction errors of its pipetrain configurations."""
    mine = [r for r in runs if r.model == setup.name]
    rows = {label: summarize(mine, label) for label in labels}
    single = rows["single"].samples_per_s
    torch_best = max((s.samples_per_s for k, s in rows.items() if k.startswith("torch") and s.samples_per_s),
                     default=None)
    best_label = next((k for k, s in rows.items() if s.samples_per_s == torch_best and k.startswith("torch")), "—")
    lines = [f"### {setup.name}, batch {setup.batch}", "",
             f"Planned setting: **{describe(setup.plans['planned'])}**; {setup.partition_note}. "
             f"Best torch configuration (of all schedules): {best_label}.", "",
             *([f"Calibrated on its own work (pipetrain.calibrate.fit): {setup.calibration}.", ""]
               if setup.calibration else []),
             *torch_schedule_lines(rows, rows["planned"].samples_per_s, micro_of(labels)),
             "| configuration | samples/s (median) | min–max | × single | × best torch | × torch same m "
             "| measured ms | predicted ms | pred. error | pred. ms, no contention | runs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for label, s in rows.items():
        twin = rows.get(label.replace("pipetrain", "torch")) if label.startswith("pipetrain") else None
        same = s.samples_per_s / twin.samples_per_s if twin and twin.samples_per_s and s.samples_per_s else None
        spread = f"{s.spread[0]:.0f}–{s.spread[1]:.0f}" if s.spread else s.status[:60]
        pipetrain_run = label.startswith("pipetrain") or label == "planned"
        if pipetrain_run and s.error is not None:
            errors.append(s.error)
        lines.append(
            f"| {label} | {_fmt(s.samples_per_s, '.1f')} | {spread} "
            f"| {ratio(s.samples_per_s, single)} | {ratio(s.samples_per_s, torch_best)} "
            f"| {_fmt(same, '.2f', 1, '×')} "
            f"| {_fmt(s.iteration_s, '.1f', 1e3)} | {_fmt(s.predicted_s, '.1f', 1e3)} "
            f"| {_fmt(s.error, '+.1%') if pipetrain_run or label == 'single' else ''} "
            f"| {_fmt(setup.predicted_alone_s.get(label), '.1f', 1e3) if pipetrain_run else ''} | {s.n_ok} |"
        )
    return [*lines, "", *_targets(rows, single, torch_best), ""], errors


def ratio(x: float | None, base: float | None) -> str:
    """``x / base`` as ``1.23×`` (the benchmarks' one ratio format); ``—`` when either is missing:
    None, 0, negative or NaN (a configuration that did not run, or no base to compare with)."""
    return f"{x / base:.2f}×" if x is not None and base is not None and x > 0 and base > 0 else "—"


def _targets(rows: dict[str, Summary], single: float | None, torch_best: float | None) -> list[str]:
    planned = rows["planned"].samples_per_s
    out = []
    if planned and torch_best:
        out.append(f"- planned / best torch = {planned / torch_best:.2f}× (target ≥ 1.15×): "
                   f"{'met' if planned / torch_best >= 1.15 else 'NOT met'}")
    if planned and single:
        out.append(f"- planned / single process = {planned / single:.2f}× (target ≥ 1.3×): "
                   f"{'met' if planned / single >= 1.3 else 'NOT met'}")
    kept, plain = rows["single+alloc"].samples_per_s, rows["planned-noalloc"].samples_per_s
    if planned and kept:
        out.append(f"- fairer: planned / single process with the same allocator setting = {planned / kept:.2f}×")
    if plain and torch_best and single:
        out.append(f"- without the allocator setting: planned / best torch = {plain / torch_best:.2f}×, "
                   f"planned / single = {plain / single:.2f}×")
    twin = {k: rows.get(k.replace("pipetrain", "torch")) for k in rows if k.startswith("pipetrain")}
    same = [(k, rows[k].samples_per_s / t.samples_per_s) for k, t in twin.items()  # type: ignore[operator]
            if t is not None and t.samples_per_s and rows[k].samples_per_s]
    if same:
        below = [f"{k} ({r:.2f}×)" for k, r in same if r < 1.0]
        out.append(f"- same-setting pipetrain / torch ≥ 1.0× (target): {len(same) - len(below)} of {len(same)} "
                   f"settings met{'; below: ' + ', '.join(below) if below else ''}")
    return out


def write_report(bench: Bench) -> str:
    labels = [c.label for c in bench.configs]
    lines = ["# Core benchmark: pipetrain vs torch pipelining vs single process", "",
             _meta_line(bench.meta), ""]
    all_errors: list[float] = []
    for setup in bench.setups:
        model_lines, errors = model_report(setup, bench.runs, labels)
        lines += model_lines
        all_errors += errors
    lines += ["### Fidelity (b)", ""]
    if all_errors:
        abs_errors = [abs(e) for e in all_errors]
        med, worst = statistics.median(abs_errors), max(abs_errors)
        lines.append(f"Over {len(all_errors)} pipetrain configurations (predicted vs median measured iteration): "
                     f"median |error| {med:.1%} (target ≤ 10%: {'met' if med <= 0.10 else 'NOT met'}), "
                     f"worst {worst:.1%} (target ≤ 20%: {'met' if worst <= 0.20 else 'NOT met'}).")
        per_run = [abs(r.predicted_s - r.iteration_s) / r.iteration_s for r in bench.runs
                   if r.label.startswith(("pipetrain", "planned")) and r.predicted_s and r.iteration_s]
        if per_run:
            lines.append(f"Per individual run ({len(per_run)} runs): median |error| "
                         f"{statistics.median(per_run):.1%}, worst {max(per_run):.1%}.")
        lines.append(quiet_error_line(bench.runs, int(str(bench.meta.get("warmup_steps", 2)))))
    lines += ["", *(identical_programs_line(bench.runs, setup.name) for setup in bench.setups)]
    lines += ["", *(ranking_line(setup.name, bench.runs) for setup in bench.setups)]
    gantts = [f"![{s.name}](gantt_{s.name}.png)" for s in bench.setups if s.name in bench.planned_timelines]
    lines += ["", *gantts, ""]
    text = "\n".join(lines)
    write_atomic(bench.out / "core.md", text)
    return text


def ranking_line(model: str, runs: Sequence[Run]) -> str:
    """Does the simulator rank pipetrain's settings as they measured? Kendall's tau-b between predicted
    and median measured iterations (target ≥ 0.8), and how far the predicted best measured from the
    measured best (target within 5 %)."""
    times: dict[str, list[float]] = {}
    predicted: dict[str, float] = {}
    for r in runs:
        if r.model == model and r.label.startswith(("pipetrain", "planned")) and r.label != "planned-noalloc" \
                and r.iteration_s and r.predicted_s:
            times.setdefault(r.label, []).append(r.iteration_s)
            predicted[r.label] = r.predicted_s
    rows = [(statistics.median(v), predicted[k], k) for k, v in times.items()]
    tau = kendall_tau_b([r[0] for r in rows], [r[1] for r in rows])
    if math.isnan(tau):
        return f"- {model}: too few measured settings to rank"
    best, top = min(rows), min(rows, key=lambda x: x[1])
    return (f"- {model}: ranking of {len(rows)} settings, Kendall tau-b {tau:+.2f} (target ≥ 0.8: "
            f"{'met' if tau >= 0.8 else 'NOT met'}); the predicted best ({top[2]}) measured "
            f"{top[0] / best[0] - 1:+.1%} from the measured best ({best[2]}) (target within 5%: "
            f"{'met' if top[0] <= 1.05 * best[0] else 'NOT met'})")


def _meta_line(meta: dict[str, object]) -> str:
    probe = meta.get("probe", {})
    assert isinstance(probe, dict)
    return (f"torch {meta.get('torch')}, {meta.get('cpu_count')} cores, {meta.get('repeats')} rounds; "
            f"probe: latency {probe.get('latency_s', 0) * 1e6:.0f} µs, bandwidth "
            f"{probe.get('bandwidth_bytes_per_s', 0) / 1e9:.2f} GB/s, two ranks computing at once run at "
            f"{(probe.get('shared_speed') or [1.0, 1.0])[-1]:.2f}× each, "
            f"action overhead {probe.get('action_overhead_s', 0) * 1e6:.0f} µs "
            f"({'measured' if probe.get('overhead_measured') else 'given'}); each model's own work at once: "
            f"{probe.get('model_shared_speed', {})}. "
            "Ratios are of medians over rounds; errors are (predicted − measured) / measured.")


def save_gantts(bench: Bench) -> None:
    """Predicted beside measured for each model's planned setting (the median planned run)."""
    from pipetrain.viz.gantt import save_gantt

    for setup in bench.setups:
        measured = sorted(bench.planned_timelines.get(setup.name, []), key=lambda p: p[0])
        if not measured:
            continue
        timeline = measured[(len(measured) - 1) // 2][1]
        plan = setup.plans["planned"]
        stage_of = plan.rank_stages
        save_gantt([setup.predicted["planned"], timeline], bench.out / f"gantt_{setup.name}.png",
                   [f"predicted: {setup.name} {describe(plan)}", "measured (median run)"], stage_of_rank=stage_of)
