"""``--planner auto``: run every planner, keep the fastest plan that fits (DESIGN.md §4).

    result = plan_auto(model=graph.name, fingerprint=graph.fingerprint(), layer_names=graph.names,
                       cost=cost, batch_size=64)
    result.plan, result.cluster          # the winner and the cluster its ranks index
    for o in result.outcomes: print(o.planner, o.iteration_s, o.note)

The planners, each simulated by the event simulator on the same cost model:

* ``balanced``: GPipe and 1F1B with an exact min–max layer split and equal micro-batches
  (:func:`~pipetrain.plan.planner.plan_equal`), one stage per device;
* ``tidgap`` and ``1f1b-ga``: UMPIPE's unequal micro-batches (PAPERS.md §1) on the balanced plan's
  stages, under memory caps (:func:`~pipetrain.plan.microbatch.uedp.plan_uedp`);
* ``pipedream``: PipeDream's DP over layers, machines and replication (PAPERS.md §2,
  :func:`~pipetrain.plan.pipedream.plan_pipedream`);
* ``bapipe``: BaPipe's exploration of method × stages × micro-batches × device order (PAPERS.md §4,
  :func:`~pipetrain.plan.bapipe.explore`).

A plan is feasible when every stage's predicted memory (:func:`~pipetrain.plan.microbatch.caps.
memory_need`) fits its device. A planner that finds nothing feasible is reported with its reason; the
fastest feasible plan wins (ties: the earlier planner in the list above).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.bapipe import explore
from pipetrain.plan.microbatch import GAConfig, PlannerName, microbatch_caps, overflows
from pipetrain.plan.microbatch.caps import fits_without_recompute
from pipetrain.plan.microbatch.uedp import plan_uedp
from pipetrain.plan.pipedream import plan_pipedream
from pipetrain.plan.plan import Method, Plan
from pipetrain.plan.planner import Candidate, plan_equal, rank_key

__all__ = ["AUTO_PLANNERS", "AutoResult", "Outcome", "plan_auto"]

log = logging.getLogger(__name__)

AUTO_PLANNERS = ("balanced", "tidgap", "1f1b-ga", "pipedream", "bapipe")
_GA = GAConfig(population=48, generations=60)


@dataclass(frozen=True)
class Outcome:
    """One planner's answer.

    Attributes:
        planner: its name.
        plan: its fastest feasible plan, or None.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it leaves devices idle).
        note: why there is no plan, or what the plan is (method, stages, micro-batches).
    """

    planner: str
    plan: Plan | None
    cluster: Cluster | None
    note: str

    @property
    def iteration_s(self) -> float:
        return self.plan.prediction.iteration_s if self.plan and self.plan.prediction else float("inf")


@dataclass(frozen=True)
class AutoResult:
    """The winner and every planner's outcome (in :data:`AUTO_PLANNERS` order)."""

    plan: Plan
    cluster: Cluster
    outcomes: tuple[Outcome, ...]

    @property
    def winner(self) -> str:
        return min((o for o in self.outcomes if o.plan is not None), key=lambda o: o.iteration_s).planner


def _describe(plan: Plan) -> str:
    layers = "/".join(s.label for s in plan.stages)
    return f"{plan.method.value}, stages {layers}, {len(plan.stages[0].forward_sizes)} micro-batches"


def _fits(plan: Plan, cost: CostModel) -> str:
    """Empty when the plan fits its devices, else which stage does not."""
    over = overflows(plan, cost)
    if not over:
        return ""
    k, need, have = over[0]
    return f"stage {k} needs {need / 2**20:.0f} MiB, its device has {have / 2**20:.0f} MiB"


def plan_auto(
    *,
    model: str,
    fingerprint: str,
    layer_names: Sequence[str],
    cost: CostModel,
    batch_size: int,
    seed: int = 0,
    on_planner: Callable[[str], None] | None = None,
) -> AutoResult:
    """Run every planner of :data:`AUTO_PLANNERS` and keep the fastest feasible plan.

    Args:
        model, fingerprint, layer_names: the model.
        cost: profiles (one per device kind for mixed clusters) and the cluster.
        batch_size: samples per mini-batch.
        seed: the GA planners' seed.
        on_planner: called with each planner's name before it runs (progress).

    Raises:
        UserError: no planner found a plan that fits; the message lists each one's reason.
    """
    n_stages = min(cost.cluster.n_devices, len(layer_names))
    balanced: list[Candidate] = []
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        balanced += plan_equal(model=model, fingerprint=fingerprint, layer_names=layer_names, cost=cost,
                               method=method, n_stages=n_stages, batch_size=batch_size)[1]
    balanced.sort(key=rank_key)
    fitting = [c.plan for c in balanced if not _fits(c.plan, cost)]

    def run_balanced() -> tuple[Plan, Cluster]:
        if not fitting:
            raise UserError(f"no equal plan on {n_stages} stages fits: {_fits(balanced[0].plan, cost)}")
        return fitting[0], cost.cluster

    def run_ga(planner: PlannerName) -> tuple[Plan, Cluster]:
        base = replace(balanced[0].plan, prediction=None)
        caps = microbatch_caps(base, cost)
        if not all(fits_without_recompute(base, cost)):
            base = replace(base, recompute=True)
        return plan_uedp(base, cost, planner=planner, seed=seed, config=_GA, caps=caps), cost.cluster

    def run_pipedream() -> tuple[Plan, Cluster]:
        result = plan_pipedream(model=model, fingerprint=fingerprint, layer_names=layer_names, cost=cost,
                                batch_size=batch_size)
        return result.plan, result.cluster

    def run_bapipe() -> tuple[Plan, Cluster]:
        result = explore(model=model, fingerprint=fingerprint, layer_names=layer_names, cost=cost,
                         batch_size=batch_size)
        return result.plan, result.cluster

    runners: dict[str, Callable[[], tuple[Plan, Cluster]]] = {
        "balanced": run_balanced, "tidgap": lambda: run_ga("tidgap"), "1f1b-ga": lambda: run_ga("1f1b-ga"),
        "pipedream": run_pipedream, "bapipe": run_bapipe,
    }
    outcomes = [_outcome(name, runners[name], cost, on_planner) for name in AUTO_PLANNERS]
    found = [o for o in outcomes if o.plan is not None]
    if not found:
        reasons = "; ".join(f"{o.planner}: {o.note}" for o in outcomes)
        raise UserError(f"no planner found a plan that fits ({reasons}); use a smaller batch, more devices or "
                        "devices with more memory")
    best = min(found, key=lambda o: o.iteration_s)
    assert best.plan is not None and best.cluster is not None
    log.info("auto: %s wins with %.6f s", best.planner, best.iteration_s)
    return AutoResult(best.plan, best.cluster, tuple(outcomes))


def _outcome(name: str, run: Callable[[], tuple[Plan, Cluster]], cost: CostModel,
             on_planner: Callable[[str], None] | None) -> Outcome:
    if on_planner is not None:
        on_planner(name)
    try:
        plan, cluster = run()
    except UserError as e:
        return Outcome(name, None, None, str(e).split("\n")[0])
    why = _fits(plan, cost.on(cluster))
    if why:
        return Outcome(name, None, None, f"{_describe(plan)}: over memory, {why}")
    return Outcome(name, plan, cluster, _describe(plan))
