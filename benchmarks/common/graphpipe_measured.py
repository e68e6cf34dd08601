"""GraphPipe's measured part: method ``graph`` against chain plans on 2 and 3 local ranks.

Per model and rank count, from one measured profile (:func:`pipetrain.api.profile_model`) and
:func:`pipetrain.api.local_cluster`, the options are graphpipe's plan, a hand-made graph plan with
the branches on their own stages (:func:`branch_stages`, its micro-batch count the best predicted),
and the chain plans of the pipedream and balanced planners (duplicates dropped). Every option trains
``steps`` steps (2 warm-up) in one :func:`~pipetrain.runtime.train.train_many` launch, in
alternating order for ``rounds`` rounds; an option's figure is the median of its per-round
samples/s, and ``vs best chain`` the median over rounds of its samples/s over the best chain plan's
in the same round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from pipetrain import api
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.plan.stage_graph import induced_edges
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, TrainJob, train_many

__all__ = ["BATCH", "RANKS", "measured_rows"]

BATCH = {"branchy-digits": 64, "mmt-tiny": 32}
RANKS = (2, 3)
PLANNERS = ("graphpipe", "pipedream", "balanced")


def _branch(prefix: str, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n.startswith(prefix)]


def branch_stages(graph: LayerGraph, n_ranks: int) -> list[list[str]]:
    """The hand-made stages: whole branches on their own stages, the merge and head on the last."""
    names = graph.names
    if graph.name == "branchy-digits":
        mlp, img = _branch("mlp", names), _branch("img", names)
        return [img, [*mlp, "concat", "head"]] if n_ranks == 2 else [mlp, img, ["concat", "head"]]
    b = [_branch(f"b{k}_", names) for k in range(4)]  # mmt-tiny: 4 branches
    if n_ranks == 2:
        return [b[0] + b[1], [*b[2], *b[3], "concat", "head"]]
    return [b[0] + b[1], b[2], [*b[3], "concat", "head"]]


@dataclass
class Option:
    """One plan to run: its prediction and, per round, its measured samples/s."""

    label: str
    plan: Plan
    predicted: float
    measured: list[float]

    @property
    def is_chain(self) -> bool:
        """A sequential plan: a chain method, or one stage (data parallelism)."""
        return self.plan.method is not Method.GRAPH or len(self.plan.stages) == 1


def predicted_sps(plan: Plan, profile: Profile) -> float:
    """Samples/s the event simulator predicts on the measured profile and the local cluster."""
    _, timeline = api.predict(plan, profile, api.local_cluster(plan.n_ranks))
    return plan.batch_size / timeline.iteration_s


def hand_plan(graph: LayerGraph, profile: Profile, n_ranks: int, batch: int) -> Plan:
    """The branch-per-stage graph plan (one rank a stage), the best predicted of 1–8 micro-batches."""
    stages = branch_stages(graph, n_ranks)
    edges = induced_edges(graph, stages)
    plans = []
    for m in (1, 2, 4, 8):
        sizes = equal_sizes(batch, m)
        plans.append(Plan(graph.name, graph.fingerprint(), batch, Method.GRAPH,
                          tuple(StagePlan(tuple(s), (k,), sizes, sizes) for k, s in enumerate(stages)), edges=edges))
    return max(plans, key=lambda p: predicted_sps(p, profile))


def options_for(graph: LayerGraph, profile: Profile, n_ranks: int, batch: int) -> list[Option]:
    """graphpipe's, the hand-made graph plan, pipedream's and balanced's plans, without duplicates."""
    cluster = api.local_cluster(n_ranks)
    plans = [(p, api.plan(graph, profile, cluster, batch_size=batch, planner=p).plan) for p in PLANNERS]
    plans.insert(1, ("graph, branch per stage", hand_plan(graph, profile, n_ranks, batch)))
    found: list[Option] = []
    for label, plan in plans:
        same = next((o for o in found if _shape(o.plan) == _shape(plan)), None)
        if same is not None:
            same.label += f" = {label}"
            continue
        found.append(Option(label, plan, predicted_sps(plan, profile), []))
    return found


def _shape(plan: Plan) -> tuple[object, ...]:
    """What makes two plans run the same (method ``graph`` with one stage runs as gpipe does)."""
    method = Method.GPIPE if plan.method is Method.GRAPH and len(plan.stages) == 1 else plan.method
    return method, tuple((s.layers, s.ranks, s.forward_sizes) for s in plan.stages), plan.edges


def run_rounds(graph: LayerGraph, options: list[Option], steps: int, rounds: int) -> None:
    """Train every option ``steps`` steps per round, alternating order, in one launch."""
    config = TrainConfig(steps=steps, warmup_steps=2, progress=False, timeout_s=120.0)
    order: list[Option] = []
    for r in range(rounds):
        order += options if r % 2 == 0 else options[::-1]
    results = train_many([TrainJob(graph, o.plan, config) for o in order])
    for option, result in zip(order, results, strict=True):
        option.measured.append(result.samples_per_s)


def vs_chain(option: Option, options: list[Option]) -> float:
    """Median over rounds of ``option``'s samples/s over the best chain plan's (by median) in that round."""
    chain = max((o for o in options if o.is_chain), key=lambda o: statistics.median(o.measured))
    return statistics.median(a / b for a, b in zip(option.measured, chain.measured, strict=True))


@cache
def _profile(model: str, batch: int) -> Profile:
    return api.profile_model(build_model(model), batch, repeats=5)


def measured_rows(model: str, n_ranks: int, steps: int, rounds: int) -> list[dict[str, Any]]:
    """Every option's row for ``model`` on ``n_ranks`` local ranks (module docstring)."""
    graph, batch = build_model(model), BATCH[model]
    profile = _profile(model, batch)
    options = options_for(graph, profile, n_ranks, batch)
    run_rounds(graph, options, steps, rounds)
    return [{"part": "measured", "model": model, "n_ranks": n_ranks, "batch": batch, "label": o.label,
             "method": o.plan.method.value, "stages": [s.label for s in o.plan.stages],
             "n_micro": len(o.plan.stages[0].forward_sizes), "predicted_sps": o.predicted, "measured_sps": o.measured,
             "median_sps": statistics.median(o.measured), "vs_best_chain": vs_chain(o, options)} for o in options]
