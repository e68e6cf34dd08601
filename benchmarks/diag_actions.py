"""Where a prediction goes wrong, action kind by action kind: measured against predicted seconds per
iteration on each rank, for 2-rank settings of one model (by default the mlp's three settings at m = 2
that `auto` weighs against each other).

    PYTHONPATH=. .venv/bin/python benchmarks/diag_actions.py --out benchmarks/results/diag-actions
    PYTHONPATH=. .venv/bin/python benchmarks/diag_actions.py --model gpt-tiny --batch 64 \
        --settings zbv@8,zb1@8,interleaved@8 --profile benchmarks/results/core-issue17-final/profile_gpt-tiny.json \
        --cluster benchmarks/results/core-issue17-final/cluster_gpt-tiny.json --out benchmarks/results/diag-actions-gpt

The model is profiled and the 2-rank cluster probed (link, all-reduce, contention on the model's own
work, the runtime's cost per action) as the Core benchmark does, or both are read from a Core run's
files (``--profile``, ``--cluster``); then each setting (``method[:chunks]@m``: a looped method's
chunks per rank, default 2; the others are two balanced stages; ``--plan FILE``: a saved plan)
trains ``--rounds`` times, alternating (10 steps, 2 warm-up, one thread per rank). For each setting:
the predicted iteration, the median measured one, and per rank and action kind (F, B, W, STEP,
SEND_F, RECV_F, ...) the seconds the simulator's timeline gives them beside those of the measured
timeline of the median run (its median step). A RECV's time is waiting; a SEND's is the sender's own time in ``isend``.

Output under ``--out``: ``diag_actions.json`` and ``diag_actions.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.measured import probe_cluster, profile_logged

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.interleaved import build_interleaved_plan
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, train
from pipetrain.simulate.timeline import Timeline

SETTINGS = "interleaved-zb:4@2,zbv@2,interleaved-zb:2@2"
LOOPED = (Method.INTERLEAVED, Method.INTERLEAVED_ZB, Method.ZBV)


def parse_setting(text: str) -> tuple[str, Method, int, int]:
    """``"interleaved-zb:4@2"`` -> (label, method, chunks per rank, micro-batches)."""
    name, _, m = text.partition("@")
    name, _, chunks = name.partition(":")
    method = Method(name)
    v = int(chunks or 2) if method in LOOPED else 1
    label = f"{name} v={v} m={m}" if method in LOOPED else f"{name} m={m}"
    return label, method, v, int(m)


def build_plan(graph: LayerGraph, cost: CostModel, batch: int, method: Method, chunks: int, n_micro: int) -> Plan:
    """The Core benchmark's plan of this setting on 2 ranks."""
    if method in LOOPED:
        return build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=2, chunks=chunks, batch_size=batch,
                                      n_micro=n_micro, method=method)
    return build_balanced_plan(ModelRef.of(graph), cost, method=method, n_stages=2, batch_size=batch, n_micro=n_micro)


def by_kind(timeline: Timeline) -> dict[str, float]:
    """``"rank kind"`` -> seconds of that rank's actions of that kind in the timeline's iteration."""
    out: dict[str, float] = defaultdict(float)
    for event in timeline.events:
        out[f"{event.rank} {event.action.kind.value}"] += event.duration_s
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/diag-actions"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--settings", default=SETTINGS, help="comma-separated method[:chunks]@m")
    parser.add_argument("--profile", type=Path, help="a saved profile (a Core run's profile_<model>.json)")
    parser.add_argument("--cluster", type=Path, help="a saved cluster (a Core run's cluster_<model>.json)")
    parser.add_argument("--plan", type=Path, action="append", default=[],
                        help="a saved plan JSON to diagnose too (repeatable; e.g. a Core run's planned plan)")
    args = parser.parse_args()
    graph = build_model(args.model)
    profile = Profile.from_json(args.profile.read_text()) if args.profile else profile_logged(graph, args.batch)
    info: dict[str, object] = {"from": str(args.cluster)}
    if args.cluster:
        cluster = Cluster.from_json(args.cluster.read_text())
    else:
        cluster, info = probe_cluster(None, 3, model=(graph, max(1, args.batch // 2)))
    cost = CostModel(profile, cluster)
    plans = {label: build_plan(graph, cost, args.batch, method, chunks, m)
             for label, method, chunks, m in map(parse_setting, filter(None, args.settings.split(",")))}
    plans.update({f"plan {path.name}": Plan.from_json(path.read_text()) for path in args.plan})
    config = TrainConfig(steps=10, warmup_steps=2, progress=False, threads_per_rank=1, timeout_s=60.0,
                         keep_freed_memory=True)
    runs: dict[str, list[tuple[float, Timeline]]] = defaultdict(list)
    for _ in range(args.rounds):
        for label, plan in plans.items():
            result = train(graph, plan, config)
            runs[label].append((statistics.median(result.step_times_s), result.timeline))
    rows, text = [], ["| setting | rank action | predicted ms | measured ms |", "|---|---|---:|---:|"]
    for label, plan in plans.items():
        predicted = api.predict(plan, profile, cluster)[1]
        ordered = sorted(runs[label], key=lambda run: run[0])
        median_s, timeline = ordered[len(ordered) // 2]
        p, m = by_kind(predicted), by_kind(timeline)
        rows.append({"setting": label, "predicted_s": predicted.iteration_s, "measured_s": median_s,
                     "runs_s": [s for s, _ in runs[label]], "predicted_by_kind": p, "measured_by_kind": m})
        text.append(f"| **{label}** | iteration | {predicted.iteration_s * 1e3:.1f} | {median_s * 1e3:.1f} |")
        text += [f"| | {key} | {p.get(key, 0.0) * 1e3:.2f} | {m.get(key, 0.0) * 1e3:.2f} |"
                 for key in sorted(set(p) | set(m))]
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "diag_actions.json", json.dumps({"cluster": info, "settings": rows}, indent=2))
    write_atomic(args.out / "diag_actions.md", "\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
