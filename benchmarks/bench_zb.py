"""Zero-bubble benchmark: method zb1 (ZB-H1) against 1f1b, simulated at paper scale and measured here.

    .venv/bin/python benchmarks/bench_zb.py                    # ~4 min on a quiet 2-core machine
    .venv/bin/python benchmarks/bench_zb.py --skip-measured    # the simulated part alone (10 s)
    .venv/bin/python benchmarks/bench_zb.py --quick            # 4 V100s at m = 8; mlp-digits measured, 4 steps

**Simulated** (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1, ZB-H1, and
§2.2, ZB-H2, method zb2, which holds up to twice the micro-batches): gpt1-14 (zoo) with an
*estimated* V100 profile (:mod:`pipetrain.profile.estimate`, whose backward is split per kernel into
input and weight gradients) on 4 and 8 V100s in servers of 4 (:func:`common.clusters.v100_servers`:
NVLink 150 GB/s, 5 µs inside a server; 25 Gbit/s Ethernet, 20 µs between), batch ``--batch``
(default 64) in ``m`` = 8, 16, 32 equal micro-batches. Each method's stages come from the balanced
planner's exact min-max layer split at that micro-batch size (the same for every method); also
``zb1-strict`` (zb1 holding no more than 1F1B on every stage) and zb2. Each row is the event
simulator's iteration time and the most activation bytes any rank holds. The paper's figures for
reference: with ``T_F = T_B = T_W`` ZB-H1's bubble is a third of 1F1B's (its Figure 3), and its
schedules beat 1F1B by up to 23% in throughput at similar memory (abstract; the automatic ZB-1p,
measured on A100 clusters with Megatron-LM).

**Measured** on this machine: 2 local ranks (gloo, one thread each), ``mlp`` (batch 128) and
``gpt-tiny`` (batch 64); the balanced 1f1b plan (measured profile, probed cluster) and the same
stages and micro-batches run by zb1, once per round, alternating over ``--repeats`` rounds; the
median samples/s of each, and the paired ratio, beside the simulator's prediction.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.clusters import v100_servers
from common.measured import profile_logged
from common.zb_grid import plan_for, simulated
from common.zb_measured import Case, this_machine, train_cases
from common.zb_report import zb_report
from harness import Context, Experiment, Report, Row, RunInfo, main

from pipetrain import api
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, ZeroBubbleParams
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.profile.estimate import estimate_profile

STRICT = "zb1-strict"  # zb1 with ZeroBubbleParams(strict_memory=True): no more held than 1F1B on every stage
SIMULATED = ("1f1b", "zb1", "zb2", STRICT)
MEASURED = {"mlp": 128, "gpt-tiny": 64}
Setting = tuple[str, int] | tuple[Case, ...]  # ("simulated", V100s) or one model's measured cases


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=64, help="gpt1-14's batch in the simulated part (default 64)")
    p.add_argument("--steps", type=int, default=8, help="steps per measured run, 2 untimed (default 8)")
    p.add_argument("--skip-measured", action="store_true", help="the simulated part only")


def _cases(model: str, batch: int, quick: bool) -> list[Case]:
    """The balanced 1f1b plan on 2 ranks and the same stages run by zb1, with their predictions."""
    cluster = this_machine(quick, CPU_ACTION_OVERHEAD_S, 3)
    graph = build_model(model)
    profile = profile_logged(graph, batch)
    problem = PlanningProblem(ModelRef.of(graph), CostModel(profile, cluster), batch,
                              constraints=Constraints(method=Method.ONE_F_ONE_B, n_stages=2))
    base = plan_balanced(problem).plan
    return [Case(model, m.value, plan, api.predict(plan, profile, cluster)[1].iteration_s)
            for m in (Method.ONE_F_ONE_B, Method.ZB1) for plan in [base.run_by(m)]]


def settings(ctx: Context) -> list[Setting]:
    out: list[Setting] = [("simulated", d) for d in ((4,) if ctx.quick else (4, 8))]
    if not ctx.args.skip_measured:
        models = {"mlp-digits": 32} if ctx.quick else MEASURED
        out += [tuple(_cases(model, batch, ctx.quick)) for model, batch in models.items()]
    return out


def run(setting: Setting, ctx: Context) -> list[Row]:
    if isinstance(setting[0], Case):  # 1f1b and zb1 in one launch, the first alternating by round
        cases = [c for c in setting if isinstance(c, Case)][::1 if ctx.round % 2 == 0 else -1]
        return [{"part": "measured", **row} for row in train_cases(cases, 4 if ctx.quick else ctx.args.steps, 240.0)]
    if ctx.round > 0:  # deterministic: once
        return []
    devices, batch = int(setting[1]), 32 if ctx.quick else ctx.args.batch
    graph = build_model("gpt1-14")
    cost = CostModel(estimate_profile(graph, "v100", batch_size=batch), v100_servers(devices))
    rows = []
    for m in (8,) if ctx.quick else (8, 16, 32):
        for label in SIMULATED:
            plan = plan_for(ModelRef.of(graph), cost, Method.ZB1 if label == STRICT else Method(label), devices, 1,
                            batch, m)
            if label == STRICT:
                plan = replace(plan, params=ZeroBubbleParams(strict_memory=True))
            timeline = simulated(plan, cost)
            peaks = timeline.peak_activation_bytes
            rows.append({"part": "simulated", "devices": devices, "n_micro": m, "method": label,
                         "iteration_s": timeline.iteration_s, "bubble_fraction": timeline.bubble_fraction(),
                         "peak_activation_bytes": max(peaks), "stage0_activation_bytes": peaks[0]})
    return rows


def report(rows: list[Row], info: RunInfo) -> Report:
    batches = {"mlp-digits": 32} if info.quick else MEASURED
    return zb_report(rows, 32 if info.quick else info.options["batch"], batches)


EXPERIMENT = Experiment(name="zb",
                        title="Zero bubble (zb1, ZB-H1) against 1f1b: simulated at paper scale, measured here",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
