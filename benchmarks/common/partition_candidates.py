"""The candidate plans of planner-measured: every planner's simulated candidates for one model on one
cluster, deduplicated, and the few kept to run (each planner's choice, the predicted top few, and
evenly spread slower ones up to a bound)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, Prediction, StagePlan, equal_sizes
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.bapipe import explore
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.pipedream import plan_pipedream

__all__ = ["Option", "candidates", "describe", "distinct", "keep"]


@dataclass
class Option:
    """One distinct candidate plan and the planners that proposed it (``"bapipe*"``: its choice)."""

    label: str
    plan: Plan
    predicted_s: float
    chosen_by: dict[str, bool] = field(default_factory=dict)  # planner -> whether it is its choice

    @property
    def sources(self) -> list[str]:
        return [name + ("*" if chosen else "") for name, chosen in self.chosen_by.items()]


def describe(plan: Plan) -> str:
    """Short text of a plan, e.g. ``1f1b m=4 [3|3]`` or ``gpipe m=2 [6]×2`` (layers per stage, ×replicas)."""
    parts = [f"{len(s.layers)}" + (f"×{len(s.ranks)}" if len(s.ranks) > 1 else "") for s in plan.stages]
    sizes = plan.stages[0].forward_sizes
    even = equal_sizes(plan.batch_size, len(sizes))
    unequal = any(s.forward_sizes != even or s.backward_sizes != even for s in plan.stages)
    return f"{plan.method.value} m={len(sizes)}{' unequal' if unequal else ''} [{'|'.join(parts)}]"


def _key(plan: Plan) -> tuple[object, ...]:
    return (plan.method, tuple((s.layers, s.ranks, s.forward_sizes, s.backward_sizes, s.recompute)
                               for s in plan.stages))


def data_parallel_plan(graph: LayerGraph, cost: CostModel, batch: int) -> Plan:
    """The whole model replicated on ranks 0 and 1, one micro-batch each (gpipe), simulated."""
    sizes = equal_sizes(batch, 2)
    plan = Plan(graph.name, graph.fingerprint(), batch, Method.GPIPE,
                (StagePlan(tuple(graph.names), (0, 1), sizes, sizes),))
    timeline = api.predict(plan, cost.profiles, cost.cluster)[1]
    return plan.with_prediction(Prediction(timeline.iteration_s, timeline.bubble_fraction(),
                                           timeline.peak_activation_bytes, "simulated: data parallel"))


def candidates(graph: LayerGraph, cost: CostModel, batch: int) -> list[tuple[str, Plan, bool]]:
    """Every planner's simulated candidates as ``(planner, plan, chosen by that planner)``."""
    problem = PlanningProblem(ModelRef.of(graph), cost, batch)
    out: list[tuple[str, Plan, bool]] = []
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        equal = plan_balanced(PlanningProblem(ModelRef.of(graph), cost, batch,
                                              constraints=Constraints(method=method, n_stages=2)))
        out += [(f"equal-{method.value}", c.plan, c.plan is equal.plan) for c in equal.candidates]
    pipedream = plan_pipedream(problem)
    out += [("pipedream", c.plan, c.plan is pipedream.plan) for c in pipedream.candidates]
    bapipe = explore(problem)
    out += [("bapipe", c.plan, c.plan is bapipe.plan) for c in bapipe.candidates if c.feasible]
    out.append(("data-parallel", data_parallel_plan(graph, cost, batch), True))
    return out


def distinct(found: Sequence[tuple[str, Plan, bool]]) -> list[Option]:
    """One option per distinct plan (method, stages, ranks, sizes), predicted fastest first."""
    by_key: dict[tuple[object, ...], Option] = {}
    for source, plan, chosen in found:
        assert plan.prediction is not None, f"{source} returned a plan without a prediction"
        option = by_key.setdefault(_key(plan), Option(describe(plan), plan, plan.prediction.iteration_s))
        option.chosen_by[source] = option.chosen_by.get(source, False) or chosen
    options = sorted(by_key.values(), key=lambda o: o.predicted_s)
    labels = [o.label for o in options]
    for o in options:  # same short text for different plans (e.g. ranks swapped): number them
        if labels.count(o.label) > 1:
            o.label += f" #{labels[: options.index(o)].count(o.label) + 1}"
    return options


def keep(options: Sequence[Option], n_plans: int, top: int, max_slowdown: float) -> list[Option]:
    """Each planner's choice, the predicted ``top`` and evenly spread slower ones up to
    ``max_slowdown`` × the predicted best: at most ``n_plans`` (more only if the choices need it)."""
    limit_s = options[0].predicted_s * max_slowdown
    pool = [o for o in options if o.predicted_s <= limit_s]
    kept = [o for o in options if any(o.chosen_by.values())]
    kept += [o for o in pool[:top] if o not in kept]
    rest = [o for o in pool if o not in kept]
    slots = max(0, n_plans - len(kept))
    if rest and slots:
        picks = {round(i * (len(rest) - 1) / max(1, slots - 1)) for i in range(slots)} if slots > 1 else {len(rest) - 1}
        kept += [rest[i] for i in sorted(picks)]
    return sorted(kept, key=lambda o: o.predicted_s)
