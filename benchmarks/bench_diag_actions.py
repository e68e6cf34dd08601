"""Where a prediction goes wrong, action kind by action kind: measured against predicted seconds per
iteration on each rank, for 2-rank settings of one model (by default the mlp's three settings at m = 2
that ``auto`` weighs against each other).

    .venv/bin/python benchmarks/bench_diag_actions.py                     # the mlp, 3 rounds
    .venv/bin/python benchmarks/bench_diag_actions.py --quick             # gpt-tiny at batch 16, 2 settings
    .venv/bin/python benchmarks/bench_diag_actions.py --model gpt-tiny --batch 64 \\
        --settings zbv@8,zb1@8,interleaved@8 --profile <a Core run>/profile_gpt-tiny.json \\
        --cluster <a Core run>/cluster_gpt-tiny.json --plan <a saved plan>.json

The model is profiled and the 2-rank cluster probed (link, all-reduce, contention on the model's own
work, the runtime's cost per action) as the Core benchmark does (``--quick``: the default 2-rank
cluster, unprobed), or both are read from a Core run's artifacts (``--profile``, ``--cluster``); each
setting (``method[:chunks]@m``: a looped method's chunks per rank, default 2; the others are two
balanced stages; ``--plan FILE``: a saved plan) trains once per round (10 steps, 2 warm-up, one thread
per rank). For each setting: the predicted iteration, the median measured one, and per rank and action
kind (F, B, W, STEP, SEND_F, RECV_F, ...) the seconds the simulator's timeline gives them beside those
of the median run's measured timeline (its median step). A RECV's time is waiting; a SEND's is the
sender's own time in ``isend``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.core_plans import build_plan, parse_setting
from common.measured import WARMUP_STEPS, probe_cluster, profile_logged
from harness import Context, Experiment, Headline, Report, Row, RunInfo, main

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, train
from pipetrain.simulate.timeline import Timeline

SETTINGS = "interleaved-zb:4@2,zbv@2,interleaved-zb:2@2"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="zoo model (default mlp; --quick: gpt-tiny)")
    p.add_argument("--batch", type=int, help="batch (default 128; --quick: 16)")
    p.add_argument("--settings", help=f"comma-separated method[:chunks]@m (default {SETTINGS}; --quick: zbv@2,zb1@2)")
    p.add_argument("--profile", type=Path, help="a saved profile (a Core run's profile_<model>.json)")
    p.add_argument("--cluster", type=Path, help="a saved cluster (a Core run's cluster_<model>.json)")
    p.add_argument("--plan", type=Path, action="append", default=[],
                   help="a saved plan JSON to diagnose too (repeatable; e.g. a Core run's planned plan)")
    p.add_argument("--steps", type=int, default=10, help="steps per run, 2 of them warm-up (default 10)")


def by_kind(timeline: Timeline) -> dict[str, float]:
    """``"rank kind"`` -> seconds of that rank's actions of that kind in the timeline's iteration."""
    out: dict[str, float] = defaultdict(float)
    for event in timeline.events:
        out[f"{event.rank} {event.action.kind.value}"] += event.duration_s
    return dict(out)


def settings(ctx: Context) -> list[tuple[str, Plan, Timeline]]:
    """Each setting's label, plan and predicted timeline, from the profile and cluster given or made here."""
    a = ctx.args
    model, batch = a.model or ("gpt-tiny" if ctx.quick else "mlp"), a.batch or (16 if ctx.quick else 128)
    graph = build_model(model)
    profile = (Profile.from_json(a.profile.read_text()) if a.profile
               else profile_logged(graph, batch, repeats=2 if ctx.quick else 5))
    if a.cluster:
        cluster = Cluster.from_json(a.cluster.read_text())
    elif ctx.quick:  # the default 2-rank cluster: probing takes minutes on a loaded machine
        cluster = api.local_cluster(2)
    else:
        cluster, _ = probe_cluster(None, 3, model=(graph, max(1, batch // 2)))
        ctx.artifact("cluster.json").write_text(cluster.to_json())
    cost = CostModel(profile, cluster)
    texts = a.settings or ("zbv@2,zb1@2" if ctx.quick else SETTINGS)
    plans = {label: build_plan(graph, cost, batch, method, chunks, m)
             for label, method, chunks, m in map(parse_setting, filter(None, texts.split(",")))}
    plans.update({f"plan {path.name}": Plan.from_json(path.read_text()) for path in a.plan})
    return [(label, plan, api.predict(plan, profile, cluster)[1]) for label, plan in plans.items()]


def run(setting: tuple[str, Plan, Timeline], ctx: Context) -> list[Row]:
    label, plan, predicted = setting
    steps = 5 if ctx.quick else ctx.args.steps
    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1, timeout_s=60.0,
                         keep_freed_memory=True)
    result = train(build_model(plan.model), plan, config)
    return [{"setting": label, "model": plan.model, "batch": plan.batch_size, "predicted_s": predicted.iteration_s,
             "measured_s": statistics.median(result.step_times_s), "predicted_by_kind": by_kind(predicted),
             "measured_by_kind": by_kind(result.timeline)}]


def report(rows: list[Row], info: RunInfo) -> Report:
    text = ["| setting | rank action | predicted ms | measured ms |", "|---|---|---:|---:|"]
    errors = []
    for label in dict.fromkeys(r["setting"] for r in rows):
        mine = sorted((r for r in rows if r["setting"] == label), key=lambda r: r["measured_s"])
        median = mine[len(mine) // 2]  # the median run: its breakdown is shown
        p, m = median["predicted_by_kind"], median["measured_by_kind"]
        errors.append(100 * (median["predicted_s"] / median["measured_s"] - 1))
        runs = ", ".join(f"{r['measured_s'] * 1e3:.1f}" for r in mine)
        text.append(f"| **{label}** | iteration ({len(mine)} runs: {runs} ms) "
                    f"| {median['predicted_s'] * 1e3:.1f} | {median['measured_s'] * 1e3:.1f} |")
        text += [f"| | {key} | {p.get(key, 0.0) * 1e3:.2f} | {m.get(key, 0.0) * 1e3:.2f} |"
                 for key in sorted(set(p) | set(m))]
    model = f"{rows[0]['model']}, batch {rows[0]['batch']}" if rows else "?"
    worst = max(errors, key=abs, default=None)
    headline = Headline("fidelity", "diagnosed settings: worst iteration error (predicted / measured − 1)", worst,
                        "%", config=f"measured, 2 CPU ranks, {model}, {len(errors)} settings")
    return Report("\n".join(text), (headline,))


EXPERIMENT = Experiment(name="diag-actions", title="Diagnosis: predicted against measured seconds per action kind",
                        settings=settings, run=run, report=report, arguments=arguments, repeats=3)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
