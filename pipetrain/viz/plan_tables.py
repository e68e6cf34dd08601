"""Text tables of profiles, plans and planner candidates (rendered with rich, returned as str)."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table

from pipetrain.plan.plan import Plan
from pipetrain.plan.planner import Candidate
from pipetrain.profile.table import Profile
from pipetrain.viz.tables import _num, _render, time_unit

__all__ = ["candidates_table", "plan_table", "profile_table", "sizes_text"]

_MIB = 2**20


def sizes_text(sizes: Sequence[int], limit: int = 8) -> str:
    """``[16×8]`` for equal sizes, else the list (shortened past ``limit`` entries)."""
    if len(set(sizes)) == 1:
        return f"[{sizes[0]}×{len(sizes)}]"
    shown = ", ".join(map(str, sizes[:limit]))
    return f"[{shown}{', ...' if len(sizes) > limit else ''}] ({len(sizes)})"


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


def plan_table(plan: Plan, *, width: int = 110) -> str:
    """Per stage: layers, ranks and micro-batch sizes; the prediction in the caption."""
    caption = ""
    if plan.prediction is not None:
        unit, scale = time_unit(plan.prediction.iteration_s)
        caption = (f"predicted iteration {_num(plan.prediction.iteration_s * scale)} {unit}, "
                   f"bubble {plan.prediction.bubble_fraction:.1%} ({plan.prediction.basis})")
    table = Table(title=f"plan: {plan.model}, {plan.method.value}, batch {plan.batch_size}",
                  caption=caption, box=box.ROUNDED)
    for name in ("stage", "ranks", "layers", "forward sizes", "backward sizes"):
        table.add_column(name)
    for k, stage in enumerate(plan.stages):
        layers = stage.layers[0] if len(stage.layers) == 1 else f"{stage.layers[0]} … {stage.layers[-1]}"
        table.add_row(str(k), ",".join(map(str, stage.ranks)), f"{layers} ({len(stage.layers)})",
                      sizes_text(stage.forward_sizes), sizes_text(stage.backward_sizes))
    return _render(table, width)


def candidates_table(candidates: Sequence[Candidate], *, top: int = 8, width: int = 110) -> str:
    """The ``top`` fastest candidates the planner simulated, with their slowdown vs the best."""
    best = candidates[0].iteration_s
    unit, scale = time_unit(best)
    table = Table(title=f"planner candidates (best {top} of {len(candidates)})", box=box.ROUNDED)
    for name in ("#", "method", "micro-batches", "stage layers", f"predicted ({unit})", "vs best"):
        table.add_column(name, justify="right" if name != "method" else "left")
    for i, c in enumerate(candidates[:top]):
        table.add_row(str(i + 1), c.plan.method.value, sizes_text(c.plan.stages[0].forward_sizes),
                      "/".join(str(len(s.layers)) for s in c.plan.stages), _num(c.iteration_s * scale),
                      f"{c.iteration_s / best:.3f}×")
    return _render(table, width)
