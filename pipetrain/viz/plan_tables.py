"""Text tables of profiles, plans and planner candidates (rendered with rich, returned as str)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import singledispatch

from rich import box
from rich.table import Table

from pipetrain.plan.methods import METHODS, SizeRule
from pipetrain.plan.plan import Plan
from pipetrain.planners.auto import ASYNC_NOTE, AutoReport
from pipetrain.planners.bapipe import BapipeCandidate, BapipeResult
from pipetrain.planners.contract import Candidate, PlanningResult
from pipetrain.planners.registry import PLANNERS
from pipetrain.planners.report import CandidatesPart, NotePart, PlanPart, default_layout
from pipetrain.profile.table import Profile
from pipetrain.viz.tables import _num, _render, time_unit

__all__ = ["auto_table", "bapipe_table", "candidates_table", "plan_table", "profile_table", "result_tables",
           "sizes_text", "within_noise_line"]

_MIB = 2**20


def sizes_text(sizes: Sequence[int], limit: int = 6) -> str:
    """Run-length ``size×count``: ``[16×8]`` for equal sizes, else the runs and the count, e.g.
    ``[8×3, 4, 2×2] (6)``; past ``limit`` runs, the first and last few around ``…``.

    >>> sizes_text([8, 8, 8, 4, 2, 2])
    '[8×3, 4, 2×2] (6)'
    """
    runs = [(size, len(list(group))) for size, group in itertools.groupby(sizes)]
    if len(runs) == 1:
        return f"[{sizes[0]}×{len(sizes)}]"
    parts = [f"{size}×{count}" if count > 1 else str(size) for size, count in runs]
    if len(parts) > limit:
        parts = [*parts[: (limit + 1) // 2], "…", *parts[len(parts) - limit // 2:]]
    return f"[{', '.join(parts)}] ({len(sizes)})"


def profile_table(profile: Profile, *, width: int = 110) -> str:
    """Per layer: forward and backward time at the smallest and largest grid size, bytes, FLOPs."""
    lo, hi = profile.layers[0].sizes[0], profile.layers[0].sizes[-1]
    unit, scale = time_unit(max(lp.backward_at(hi) for lp in profile.layers))
    table = Table(title=f"profile of {profile.model} ({profile.source}, {profile.device})", box=box.ROUNDED)
    for name in ("layer", f"fwd b={lo} ({unit})", f"fwd b={hi} ({unit})", f"bwd b={hi} ({unit})",
                 "params MiB", "out KiB/sample", "GFLOP/sample"):
        table.add_column(name, justify="left" if name == "layer" else "right")
    for lp in profile.layers:
        table.add_row(
            lp.name, _num(lp.forward_at(lo) * scale), _num(lp.forward_at(hi) * scale),
            _num(lp.backward_at(hi) * scale), f"{lp.parameter_bytes / _MIB:.2f}",
            f"{lp.output_bytes_per_sample / 1024:.1f}", f"{lp.flops_per_sample / 1e9:.4f}",
        )
    return _render(table, width)


def plan_table(
    plan: Plan,
    *,
    baselines: Sequence[tuple[str, Plan]] = (),
    caps: Sequence[int | None] | None = None,
    width: int = 110,
) -> str:
    """Per stage: layers, ranks and micro-batch sizes; the prediction in the caption.

    Args:
        baselines: ``(label, plan)`` pairs to compare with, e.g. ``("best equal plan", base)`` for
            the plan a ``uedp`` plan was made from: the caption gives each one's predicted time and
            the speedup over it.
        caps: per stage, the largest micro-batch memory allows (None: no cap, shown "none"),
            shown beside the largest micro-batch of ``uedp`` plans.

    Plans with per-stage partitions (a method with each stage's own partition per pass, ``uedp``;
    unequal ``1f1b``) also show each stage's forward and backward micro-batch counts, its largest
    micro-batch (and cap); those plans, and every plan with a stage that recomputes, whether each stage
    recomputes forward in backward (the caption's basis says why a planner chose it).
    """
    caption = []
    if plan.prediction is not None:
        unit, scale = time_unit(plan.prediction.iteration_s)
        caption.append(f"predicted iteration {_num(plan.prediction.iteration_s * scale)} {unit}, "
                       f"bubble {plan.prediction.bubble_fraction:.1%} ({plan.prediction.basis})")
        caption += [_versus(plan.prediction.iteration_s, label, other) for label, other in baselines]
    table = Table(title=f"plan: {plan.model}, {plan.method.value}, batch {plan.batch_size}",
                  caption="\n".join(caption), box=box.ROUNDED)
    per_stage = plan.spec.sizes is SizeRule.PER_PASS or bool(baselines) or any(
        s.forward_sizes != plan.stages[0].forward_sizes for s in plan.stages
    )
    recomputes = [plan.recomputes(k) for k in range(plan.n_stages)]
    marked = per_stage or any(recomputes)
    columns = ["stage", "ranks", "layers", "forward sizes", "backward sizes"]
    if per_stage:
        columns += ["count F/B", "largest" if caps is None else "largest/cap"]
    if marked:
        columns.append("recompute")
    for name in columns:
        table.add_column(name, justify="right" if name.startswith(("count", "largest")) else "left")
    for k, stage in enumerate(plan.stages):
        layers = stage.layers[0] if len(stage.layers) == 1 else f"{stage.layers[0]} … {stage.layers[-1]}"
        row = [str(k), ",".join(map(str, stage.ranks)), f"{layers} ({len(stage.layers)})",
               sizes_text(stage.forward_sizes), sizes_text(stage.backward_sizes)]
        if per_stage:
            largest = str(max(*stage.forward_sizes, *stage.backward_sizes))
            if caps is not None:
                largest += f"/{'none' if caps[k] is None else caps[k]}"
            row += [f"{len(stage.forward_sizes)}/{len(stage.backward_sizes)}", largest]
        if marked:
            row.append("yes" if recomputes[k] else "no")
        table.add_row(*row)
    return _render(table, width)


def _versus(iteration_s: float, label: str, baseline: Plan) -> str:
    """``vs best equal plan (gpipe [4×8]) 3.1 ms: 1.250× speedup``."""
    if baseline.prediction is None:
        return f"vs {label}: not simulated"
    base_s = baseline.prediction.iteration_s
    unit, scale = time_unit(base_s)
    ratio = base_s / iteration_s if iteration_s > 0 else float("inf")
    return (f"vs {label} ({baseline.method.value} {sizes_text(baseline.stages[0].forward_sizes)}) "
            f"{_num(base_s * scale)} {unit}: {ratio:.3f}× speedup")


def _layout(plan: Plan) -> tuple[object, ...]:
    """What tells candidates apart: method, stage graph, stages (layers, ranks, micro-batch sizes, recompute)."""
    return plan.method, plan.edges, tuple((s.layers, s.ranks, s.forward_sizes, s.backward_sizes, s.recompute)
                                          for s in plan.stages)


def candidates_table(
    candidates: Sequence[Candidate], *, top: int = 8, title: str = "planner candidates", width: int = 110,
    kept: Plan | None = None,
) -> str:
    """The ``top`` best candidates the planner simulated (in its order: fastest first, ties to three
    significant digits going to less activation memory, then fewer micro-batches), with their time
    relative to the fastest and their peak activation memory. ``kept``: the plan the planner returned;
    when it is not the fastest (another within the profile's noise, :mod:`pipetrain.planners.noise`)
    its row is marked ``kept``."""
    best = candidates[0].iteration_s
    unit, scale = time_unit(best)
    marked = None
    if kept is not None and _layout(candidates[0].plan) != _layout(kept):
        marked = next((i for i, c in enumerate(candidates[:top]) if _layout(c.plan) == _layout(kept)), None)
    caption = ("order: fastest first; times equal to 3 digits: less activation memory, then fewer micro-batches"
               + ("; kept: the plan returned, as fast as #1 within the profile's noise" if marked is not None else ""))
    table = Table(title=f"{title} (best {top} of {len(candidates)})", box=box.ROUNDED, caption=caption)
    for name in ("#", "method", "micro-batches", "stage layers (×replicas)", f"predicted ({unit})", "vs #1",
                 "peak act. MiB"):
        table.add_column(name, justify="right" if name != "method" else "left")
    for i, c in enumerate(candidates[:top]):
        peak = max(c.plan.prediction.peak_memory_bytes, default=0) if c.plan.prediction else 0
        table.add_row(f"{i + 1} kept" if i == marked else str(i + 1), c.plan.method.value,
                      sizes_text(c.plan.stages[0].forward_sizes),
                      "/".join(s.label for s in c.plan.stages), f"{c.iteration_s * scale:.1f}",
                      f"{c.iteration_s / best:.3f}×", f"{peak / _MIB:.1f}")
    return _render(table, width)


def bapipe_table(result: BapipeResult, *, top: int = 8, infeasible: int = 3, width: int = 120) -> str:
    """BaPipe's exploration (docs/algorithms.md §4): the ``top`` fastest feasible candidates and the first
    ``infeasible`` ones that did not fit, each with its method, stage count, micro-batches, device
    order, layers per stage, predicted time and peak memory per stage (% of its device's); the
    chosen plan's prediction and memory in the caption."""
    feasible = [c for c in result.candidates if c.feasible]
    rejected = [c for c in result.candidates if not c.feasible]
    best = result.best
    unit, scale = time_unit(best.iteration_s)
    table = Table(
        title=f"bapipe: {best.plan.model}, batch {best.plan.batch_size}: {len(result.candidates)} simulated of "
        f"{result.n_scored} partitions scored ({result.n_over_memory} options fit no memory)",
        caption=_bapipe_caption(best, unit, scale), box=box.ROUNDED,
    )
    for name in ("#", "method", "S", "micro-batches", "devices", "layers", f"predicted ({unit})", "vs best",
                 "peak memory %", "fits"):
        table.add_column(name, justify="left" if name in ("method", "devices", "fits") else "right")
    for i, c in enumerate([*feasible[:top], *rejected[:infeasible]]):
        table.add_row(
            str(i + 1) if c.feasible else "-", c.method.value, str(c.n_stages), _micro_text(c),
            _kinds_text(c.placement.kinds), "/".join(map(str, c.layer_counts)), _num(c.iteration_s * scale),
            f"{c.iteration_s / best.iteration_s:.3f}×",
            "/".join(f"{100 * n / h:.0f}" for n, h in zip(c.memory_need_bytes, c.memory_bytes, strict=True)),
            "yes" if c.feasible else c.infeasible,
        )
    return _render(table, width)


def _kinds_text(kinds: Sequence[str]) -> str:
    """Device kinds in pipeline order, runs collapsed: ``h100×2/v100/h100``."""
    runs = [(kind, len(list(group))) for kind, group in itertools.groupby(kinds)]
    return "/".join(kind if n == 1 else f"{kind}×{n}" for kind, n in runs)


def _micro_text(c: BapipeCandidate) -> str:
    if METHODS[c.method].sizes is SizeRule.PER_PASS:
        return f"unequal (on {c.n_micro})"
    return sizes_text(c.plan.stages[0].forward_sizes)


def _bapipe_caption(best: BapipeCandidate, unit: str, scale: float) -> str:
    """``chosen: 1f1b, 4 stages on h100×2/v100×2 (devices 0,1,2,3), [8×4]: 5.59 ms, ...``."""
    bubble = best.plan.prediction.bubble_fraction if best.plan.prediction else float("nan")
    memory = ", ".join(f"{n / _MIB:.0f}/{h / _MIB:.0f}" for n, h in zip(best.memory_need_bytes, best.memory_bytes,
                                                                       strict=True))
    stages = f"{best.n_stages} stage{'s' if best.n_stages > 1 else ''}"
    return (f"chosen: {best.method.value}, {stages} on {_kinds_text(best.placement.kinds)} (devices "
            f"{','.join(map(str, best.placement.devices))}), {_micro_text(best)}: {_num(best.iteration_s * scale)} "
            f"{unit}, bubble {bubble:.1%}; memory per stage (MiB needed/device) {memory}")


def auto_table(result: PlanningResult, *, width: int = 120) -> str:
    """``auto``: each run's plan and predicted time beside the winner's, or why it has none; the
    asynchronous runs (``--allow-async``, docs/algorithms.md §3.5–3.6) marked as changing the
    optimizer's semantics."""
    assert isinstance(result.report, AutoReport)
    return _auto_table(result.report, width)


def _auto_table(report: AutoReport, width: int) -> str:
    winner = next(o for o in report.outcomes if o.planner == report.winner)
    best = winner.iteration_s
    unit, scale = time_unit(best)
    table = Table(title=f"planners (auto keeps the fastest that fits: {report.winner})", box=box.ROUNDED)
    for name in ("planner", f"predicted ({unit})", "vs winner", "plan, or why none", "async"):
        table.add_column(name, justify="right" if name.startswith(("predicted", "vs")) else "left")
    for o in report.outcomes:
        found = o.plan is not None
        table.add_row(o.planner, _num(o.iteration_s * scale) if found else "-",
                      f"{o.iteration_s / best:.3f}×" if found and best > 0 else "-", o.note,
                      ASYNC_NOTE if o.asynchronous else "-")
    return _render(table, width)


def within_noise_line(result: PlanningResult, *, listed: int = 4) -> str | None:
    """One line naming the candidates predicted within the profile's noise of the fastest
    (``result.within_noise``, :mod:`pipetrain.planners.noise`), the first ``listed`` of them, and which
    was kept and why; None when there are none. For example: ``3 plans are within the measurement
    noise (±12%) of the fastest: zb1 [16×2] 41.01 ms, zb2 [16×2] 41.01 ms, 1f1b [16×2] 43.1 ms; kept
    1f1b [16×2], the one with the fewest ranks, ...``.
    """
    close = result.within_noise
    if not close or result.noise is None:
        return None
    unit, scale = time_unit(close[0].iteration_s)
    layouts = {tuple(s.label for s in c.plan.stages) for c in close}

    def name(plan: Plan) -> str:
        layout = f" {'/'.join(s.label for s in plan.stages)}" if len(layouts) > 1 else ""
        return f"{plan.method.value} {sizes_text(plan.stages[0].forward_sizes)}{layout}"

    shown = ", ".join(f"{name(c.plan)} {_num(c.iteration_s * scale)} {unit}" for c in close[:listed])
    more = f", … ({len(close) - listed} more)" if len(close) > listed else ""
    return (f"{len(close)} plans are within the measurement noise (±{result.noise:.0%}) of the fastest: "
            f"{shown}{more}; kept {name(result.plan)}, the one with the fewest ranks, then the simplest method, "
            "the fewest micro-batches and the least activation memory: the fastest may differ on another run")


def result_tables(result: PlanningResult, *, top: int = 8) -> list[str]:
    """What ``pipetrain plan`` prints for any planner: the parts its spec lays its result out in
    (:attr:`~pipetrain.planners.spec.PlannerSpec.layout`): the plan, then the planner's own account
    (its candidates, BaPipe's exploration, ``auto``'s planners, a micro-batch plan's baselines)."""
    spec = PLANNERS.get(result.planner)
    parts = spec.layout(result) if spec is not None else default_layout(result)
    return [_part(part, top, result.plan) for part in parts]


@singledispatch
def _part(part: object, top: int, kept: Plan) -> str:
    raise TypeError(f"no table for a report part of type {type(part).__name__}")


@_part.register
def _(part: PlanPart, top: int, kept: Plan) -> str:
    return plan_table(part.plan, baselines=part.baselines, caps=part.caps)


@_part.register
def _(part: CandidatesPart, top: int, kept: Plan) -> str:
    return candidates_table(list(part.candidates), top=top, title=part.title, kept=kept)


@_part.register
def _(part: NotePart, top: int, kept: Plan) -> str:
    return part.text


@_part.register
def _(part: BapipeResult, top: int, kept: Plan) -> str:
    return bapipe_table(part, top=top)


@_part.register
def _(part: AutoReport, top: int, kept: Plan) -> str:
    return _auto_table(part, 120)
