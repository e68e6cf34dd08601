"""ZB-V (method ``zbv``) against 1f1b, zb1 and interleaved-zb: simulated at unit costs and at V100 scale.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_zbv.py --out benchmarks/results/zbv

Method ``zbv`` (:mod:`pipetrain.schedule.zbv`) is Zero Bubble's ZB-V (Qi et al. 2024 §6): ``2R``
stages, two per rank in a V, the backward split into B and W, orders from pipetrain's greedy list
scheduler under 1F1B's activation memory.

**Unit costs.** One layer per chunk with F = B = W = 1 (a layer with parameters, backward 2 split in
half), free links; 1f1b and zb1 on ``R`` stages of two layers, interleaved-zb and zbv on ``2R``
stages of one; R = 2, 4, 8 and m = R, 2R, 4R.

**V100 scale.** gpt1-14 with ``--blocks`` transformer blocks (default 30), estimated V100 profiles
and links (:func:`pipetrain.api.estimated_cluster`), batch ``--batch`` (default 64), R = 4 and 8,
m = 8, 16, 32: 1f1b and zb1 on R balanced stages, interleaved-zb on 2R balanced stages (looping),
zbv on 2R stages balanced per rank pair in a V (the ``interleaved`` planner's cut). The event
simulator's iteration time, bubble and the most activation bytes any rank holds.

Output under ``--out``: ``zbv.json`` and ``zbv.md``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pipetrain import api
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import Placement, placed_ranks
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

METHODS = (Method.ONE_F_ONE_B, Method.ZB1, Method.INTERLEAVED_ZB, Method.ZBV)


@dataclass(frozen=True)
class Row:
    """One simulated configuration."""

    setting: str
    ranks: int
    micro: int
    method: str
    iteration: float  # units (unit costs) or ms (V100)
    bubble: float
    peak_activation: float  # pairs' bytes (unit costs) or MiB (V100)
    speedup: float  # 1f1b's time / this one's


def unit_plan(method: Method, ranks: int, m: int) -> Plan:
    """One layer per chunk: 1f1b/zb1 two layers per stage on R stages, else 2R stages placed by the method."""
    sizes, names = equal_sizes(2 * m, m), [f"l{k}" for k in range(2 * ranks)]
    if method in (Method.ONE_F_ONE_B, Method.ZB1):
        stages = tuple(StagePlan((names[2 * k], names[2 * k + 1]), (k,), sizes, sizes) for k in range(ranks))
    else:
        placed = placed_ranks(Placement.V if method is Method.ZBV else Placement.LOOPING, 2 * ranks, ranks) or ()
        stages = tuple(StagePlan((n,), r, sizes, sizes) for n, r in zip(names, placed, strict=True))
    return Plan("unit", "", 2 * m, method, stages)


def unit_rows() -> list[Row]:
    rows = []
    for ranks in (2, 4, 8):
        layers = tuple(LayerProfile(f"l{k}", (1, 2), (1.0, 1.0), (2.0, 2.0), 0, 1, 4, 0.0)
                       for k in range(2 * ranks))
        cost = CostModel(Profile("unit", "", "cpu", "synthetic", 0, layers), Cluster.local(ranks, link=Link(0, 1e30)))
        for m in (ranks, 2 * ranks, 4 * ranks):
            rows += _rows("unit", cost, [unit_plan(method, ranks, m) for method in METHODS], 1.0, 1.0)
    return rows


def v100_rows(blocks: int, batch: int) -> list[Row]:
    graph = build_model("gpt1-14", blocks=blocks)
    profile, model, rows = estimate_profile(graph, "v100", batch), ModelRef.of(graph), []
    for ranks in (4, 8):
        cost = CostModel(profile, api.estimated_cluster("v100", ranks)[0])
        for m in (8, 16, 32):
            plans = [build_balanced_plan(model, cost, method=method, n_stages=ranks, batch_size=batch, n_micro=m)
                     for method in METHODS[:2]]
            plans += [build_interleaved_plan(model, cost, n_ranks=ranks, chunks=2, batch_size=batch, n_micro=m,
                                             method=method) for method in METHODS[2:]]
            rows += _rows("v100", cost, plans, 1e3, 2.0**-20)
            print(f"simulated R={ranks} m={m}", flush=True)
    return rows


def _rows(setting: str, cost: CostModel, plans: list[Plan], time_scale: float, byte_scale: float) -> list[Row]:
    out, base = [], 0.0
    for plan in plans:
        timeline = simulate(build_schedule(plan), plan, cost)
        base = base or timeline.iteration_s
        out.append(Row(setting, plan.n_ranks, len(plan.stages[0].forward_sizes), plan.method.value,
                       timeline.iteration_s * time_scale, timeline.bubble_fraction(),
                       max(timeline.peak_activation_bytes) * byte_scale, base / timeline.iteration_s))
    return out


def markdown(rows: list[Row]) -> str:
    lines = []
    for setting, unit in (("unit", "units, bubble, peak bytes"), ("v100", "ms, bubble, peak MiB")):
        lines += [f"| {setting}: R | m | " + " | ".join(m.value for m in METHODS) + f" ({unit}) |",
                  "|---|---|" + "---|" * len(METHODS)]
        keys = sorted({(r.ranks, r.micro) for r in rows if r.setting == setting})
        for ranks, micro in keys:
            cells = [next(r for r in rows if (r.setting, r.ranks, r.micro, r.method) == (setting, ranks, micro,
                                                                                          m.value)) for m in METHODS]
            lines.append(f"| {ranks} | {micro} | " + " | ".join(
                f"{r.iteration:.1f} ({r.bubble:.3f}, {r.peak_activation:.0f}) {r.speedup:.2f}×" for r in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/zbv"))
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    rows = unit_rows() + v100_rows(args.blocks, args.batch)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "zbv.json", json.dumps([asdict(r) for r in rows], indent=1))
    write_atomic(args.out / "zbv.md", markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
