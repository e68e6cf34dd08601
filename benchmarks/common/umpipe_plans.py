"""Every micro-batch planner of UMPIPE's simulated benchmarks on one network and cluster.

:func:`plan_all` plans, for one profile on one cluster (one stage per device):

* ``gpipe`` and ``1f1b``: the best equal plan of each (balanced layers, every micro-batch count up
  to 64 and the powers of two simulated);
* the **paper-style baselines** ``gpipe@4K`` and ``1f1b@4K``: balanced GPipe and 1F1B (PipeDream's
  order) plans at a fixed ``4K`` micro-batches for ``K`` stages. UMPIPE does not publish its
  baselines' count (PAPERS.md §1.1); ``4K`` is GPipe's own rule, "we found the bubble overhead to be
  negligible when M ≥ 4 × K" (Huang et al., NeurIPS 2019);
* on the faster equal plan's stages, the planners of PAPERS.md §1.11: ``greedy`` (local greedy),
  ``dp`` (global greedy DP), ``tidgap`` (dual chromosome, recompute costed wherever a stage's
  backward partition differs from its forward one), ``single`` (backward = forward, no recompute),
  ``tidgap-free`` (recompute free, the paper's model; also ``tidgap-free (planned)``, its own
  estimate), ``1f1b-ga`` (unequal micro-batches under the 1F1B order, pipetrain's extension);
* ``tidgap-cuts``: tidgap with the stage cuts searched too (:mod:`pipetrain.planners.cut_search`:
  the best equal plans' cuts at other counts and one-boundary moves, screened by runs of a tenth of
  the generations), never slower than tidgap on the base's cuts.

Every time is the **event simulator's** iteration time of the final plan (the planners' own
evaluators agree with it to 1e-9). The row also keeps the **floor** (:mod:`common.umpipe_floor`):
seconds that no plan of these layers on these devices, whatever its cuts and partitions, beats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from common.umpipe_floor import flush_floor_s
from common.umpipe_networks import BATCH, build, cluster_of
from pipetrain.cost import CostModel
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.cut_search import equal_cuts, layer_counts, search_cuts
from pipetrain.planners.microbatch.dp import global_dp
from pipetrain.planners.microbatch.ga import GAConfig, one_f_one_b_ga, single_chromosome, tidgap
from pipetrain.planners.microbatch.greedy import local_greedy
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.planners.microbatch.uedp import plan_uedp, with_sizes
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline
from pipetrain.simulate.vectorised import StageTables

__all__ = ["PAPER_COUNT", "PLANNERS", "best_equal", "paper_label", "plan_all"]

PAPER_COUNT = 4  # the paper-style baselines run PAPER_COUNT × K micro-batches (module docstring)
PLANNERS = ("greedy", "dp", "tidgap", "tidgap-cuts", "single", "tidgap-free", "tidgap-free (planned)", "1f1b-ga")


def paper_label(method: str) -> str:
    """The paper-style baseline's key: ``"gpipe@4K"``."""
    return f"{method}@{PAPER_COUNT}K"


def best_equal(times_s: dict[str, float]) -> float:
    """The best equal plan's seconds: the faster of gpipe and 1f1b."""
    return min(times_s["gpipe"], times_s["1f1b"])


def _event_time(plan: Plan, cost: CostModel) -> tuple[float, Timeline]:
    timeline = simulate(build_schedule(plan), plan, cost)
    return timeline.iteration_s, timeline


def _stage_sizes(plan: Plan) -> list[list[list[int]]]:
    return [[list(s.forward_sizes), list(s.backward_sizes)] for s in plan.stages]


def plan_all(network: str, cluster_name: str, profile: Profile, config: GAConfig, ga_1f1b: GAConfig,
             seed: int, cut_rounds: int) -> tuple[dict[str, object], dict[str, Timeline]]:
    """One network on one cluster (module docstring): its row and the timelines of its plans.

    The row: ``network``, ``cluster``, ``n_stages``, ``batch``, ``times_s`` and ``search_s`` per
    planner, ``sizes`` (the equal plans and tidgap-cuts: per stage [forward, backward] sizes; the
    others: [forward sizes per stage, backward sizes per stage]), ``cuts`` (layers per stage of
    the best equal plan, ``"base"``, and of ``"tidgap-cuts"``) and ``floor_s`` (module docstring)."""
    graph = build(network)
    cluster = cluster_of(cluster_name)
    cost = CostModel(profile, cluster)
    k = cluster.n_devices
    times, search, sizes, timelines = {}, {}, {}, {}
    equal, candidates = {}, {}
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        t0 = time.perf_counter()
        problem = PlanningProblem(ModelRef.of(graph), cost, BATCH, constraints=Constraints(method=method, n_stages=k))
        found = plan_balanced(problem)
        search[method.value] = time.perf_counter() - t0
        equal[method.value], candidates[method.value] = found.plan, [c.plan for c in found.candidates]
        times[method.value], timelines[method.value] = _event_time(found.plan, cost)
        sizes[method.value] = _stage_sizes(found.plan)
        fixed = PlanningProblem(ModelRef.of(graph), cost, BATCH,
                                constraints=Constraints(method=method, n_stages=k, n_micro=PAPER_COUNT * k))
        times[paper_label(method.value)] = _event_time(plan_balanced(fixed).plan, cost)[0]
    base = equal[min(("gpipe", "1f1b"), key=lambda m: times[m])]
    tables = StageTables.from_plan(base, cost)
    free = replace(tables, backward_recompute_s=tables.backward_s)  # the paper's model
    screen = replace(config, generations=max(1, config.generations // 10))

    def tidgap_on(stages: Plan, ga: GAConfig) -> Plan:
        return plan_uedp(stages, cost, planner="tidgap", seed=seed, config=ga)

    t0 = time.perf_counter()
    moved = search_cuts(base, lambda p: tidgap_on(p, config), lambda p: tidgap_on(p, screen), rounds=cut_rounds,
                        others=equal_cuts(base, candidates[base.method.value]))
    search["tidgap-cuts"] = time.perf_counter() - t0
    times["tidgap-cuts"], timelines["tidgap-cuts"] = _event_time(moved, cost)
    sizes["tidgap-cuts"] = _stage_sizes(moved)
    planners: dict[str, Callable[[], MicrobatchPlan]] = {
        "greedy": lambda: local_greedy(tables),
        "dp": lambda: global_dp(tables),
        "tidgap": lambda: tidgap(tables, seed=seed, config=config),
        "single": lambda: single_chromosome(tables, seed=seed, config=config),
        "tidgap-free": lambda: tidgap(free, seed=seed, config=config),
        "1f1b-ga": lambda: one_f_one_b_ga(tables, seed=seed, config=ga_1f1b),
    }
    for name, run in planners.items():
        t0 = time.perf_counter()
        result = run()
        search[name] = time.perf_counter() - t0
        times[name], timelines[name] = _event_time(with_sizes(base, result), cost)
        sizes[name] = [list(map(list, result.forward_sizes)), list(map(list, result.backward_sizes))]
        if name == "tidgap-free":
            times["tidgap-free (planned)"] = result.iteration_s
    floor = flush_floor_s(cost, [layer.name for layer in graph.layers], BATCH, k)
    row = {"network": network, "cluster": cluster_name, "n_stages": k, "batch": BATCH, "times_s": times,
           "floor_s": floor, "search_s": search, "sizes": sizes,
           "cuts": {"base": list(layer_counts(base)), "tidgap-cuts": list(layer_counts(moved))}}
    return row, timelines
