"""BaPipe's simulation phase: build, score and memory-check the shortlisted plans.

Each plan's ranks index the sub-cluster of the devices its placement chose
(:func:`~pipetrain.planners.device_orders.placed_cluster`); one CostModel per such set of devices
is kept. A plan is scored by :func:`~pipetrain.planners.score.score` and checked with
:func:`~pipetrain.simulate.memory.memory_need` against
:func:`~pipetrain.simulate.memory.device_memory` under the problem's optimizer.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.bapipe.candidates import BapipeCandidate, Proposal
from pipetrain.planners.bapipe.tables import LayerTables
from pipetrain.planners.contract import PlanningProblem
from pipetrain.planners.device_orders import Placement, placed_cluster
from pipetrain.planners.microbatch import GAConfig, fits_without_recompute, microbatch_caps
from pipetrain.planners.microbatch.uedp import plan_uedp
from pipetrain.planners.score import score
from pipetrain.simulate.bounds import chain_lower_bound_s
from pipetrain.simulate.memory import device_memory, memory_need

__all__ = ["Runner"]

_MIB = 2**20


class Runner:
    """Builds, simulates and memory-checks plans; caches a CostModel per set of devices used."""

    def __init__(self, problem: PlanningProblem, tables: LayerTables) -> None:
        self.problem, self.tables = problem, tables
        self.cost = tables.cost
        self._costs: dict[tuple[int, ...], CostModel] = {}
        # (method, m, devices, layer counts) -> the simulated candidate: both comm models may propose a plan
        self.simulated: dict[tuple[Method, int, tuple[int, ...], tuple[int, ...]], BapipeCandidate] = {}

    def cluster_of(self, placement: Placement) -> Cluster:
        return placed_cluster(self.cost.cluster, placement.devices)[0]

    def cost_of(self, placement: Placement) -> CostModel:
        key = tuple(sorted(placement.devices))
        if key not in self._costs:
            self._costs[key] = self.cost.on(self.cluster_of(placement))
        return self._costs[key]

    def equal(self, s: Proposal) -> BapipeCandidate:
        """Simulate the equal-micro-batch plan of a proposed cut (once; kept in :attr:`simulated`)."""
        key = (s.method, s.n_micro, s.placement.devices, s.counts)
        if key not in self.simulated:
            self.simulated[key] = self._simulate_equal(s)
        return self.simulated[key]

    def lower_bound_s(self, s: Proposal) -> float:
        """Seconds the simulation of a proposed cut takes at least
        (:func:`~pipetrain.simulate.bounds.chain_lower_bound_s`)."""
        return chain_lower_bound_s(self.plan_of(s), self.cost_of(s.placement))

    def plan_of(self, s: Proposal) -> Plan:
        """The equal-micro-batch plan of a proposed cut, its ranks those of :meth:`cluster_of`."""
        ranks = placed_cluster(self.cost.cluster, s.placement.devices)[1]
        sizes = equal_sizes(self.problem.batch_size, s.n_micro)
        stages, first = [], 0
        for k, n in enumerate(s.counts):
            stages.append(StagePlan(self.tables.names[first:first + n], (ranks[k],), sizes, sizes))
            first += n
        model = self.problem.model
        return Plan(model.name, model.fingerprint, self.problem.batch_size, s.method, tuple(stages))

    def _simulate_equal(self, s: Proposal) -> BapipeCandidate:
        return self._checked(s.method, s.n_micro, s.placement, s.analytic_s, self.plan_of(s))

    def uedp(self, base: BapipeCandidate, ga: GAConfig, seed: int) -> BapipeCandidate:
        """UMPIPE's ``tidgap`` on a feasible equal plan's stages, under memory caps (docs/algorithms.md §2.6)."""
        cost = self.cost_of(base.placement)
        start = replace(base.plan, prediction=None)
        optimizer = self.problem.optimizer
        try:
            caps = microbatch_caps(start, cost, optimizer=optimizer)
        except UserError as e:
            return replace(base, method=Method.UEDP, infeasible=f"uedp: {e}")
        fits = fits_without_recompute(start, cost, optimizer=optimizer)
        start = start.with_recompute(k for k, ok in enumerate(fits) if not ok)
        plan = plan_uedp(start, cost, planner="tidgap", seed=seed, config=ga, caps=caps,
                         smallest=self.problem.smallest_microbatch)
        return self._checked(Method.UEDP, base.n_micro, base.placement, base.analytic_s, plan)

    def _checked(self, method: Method, n_micro: int, placement: Placement, analytic_s: float,
                 plan: Plan) -> BapipeCandidate:
        cost = self.cost_of(placement)
        peaks = None  # replayed from the plan's schedule, unless this simulation just found them
        if plan.prediction is None:
            plan = score(plan, cost, label="bapipe").plan
            assert plan.prediction is not None
            peaks = plan.prediction.peak_memory_bytes
        assert plan.prediction is not None
        need = memory_need(plan, cost, optimizer=self.problem.optimizer, peaks=peaks)
        have = device_memory(plan, cost)
        over = [k for k in range(plan.n_stages) if need[k] > have[k]]
        why = "" if not over else (
            f"memory: stage {over[0]} needs {need[over[0]] / _MIB:.0f} MiB, its "
            f"{placement.kinds[over[0]]} has {have[over[0]] / _MIB:.0f} MiB")
        return BapipeCandidate(method, n_micro, placement, analytic_s, plan.prediction.iteration_s, need, have,
                               plan, why)
