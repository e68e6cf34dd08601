"""BaPipe's values: a DP proposal, a simulated candidate, and what the exploration found."""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain.cluster import Cluster
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import Candidate
from pipetrain.planners.device_orders import Placement

__all__ = ["BapipeCandidate", "BapipeResult", "Proposal"]


@dataclass(frozen=True)
class BapipeCandidate:
    """One simulated option.

    Attributes:
        method: the schedule family.
        n_micro: equal micro-batch count (``uedp``: that of the plan it was planned on).
        placement: the device of each stage, in pipeline order.
        analytic_s: the §4.2 ``T_iter`` that shortlisted it (``uedp``: its base plan's).
        iteration_s: the event simulator's iteration time.
        memory_need_bytes: per stage, predicted peak bytes (state + activations).
        memory_bytes: per stage, its device's memory.
        plan: the plan, with its :class:`Prediction`; ranks index the result's cluster for
            this placement (see the module docstring).
        infeasible: why it cannot run (empty when it can).
    """

    method: Method
    n_micro: int
    placement: Placement
    analytic_s: float
    iteration_s: float
    memory_need_bytes: tuple[int, ...]
    memory_bytes: tuple[int, ...]
    plan: Plan
    infeasible: str = ""

    @property
    def feasible(self) -> bool:
        return not self.infeasible

    @property
    def n_stages(self) -> int:
        return self.plan.n_stages

    @property
    def layer_counts(self) -> tuple[int, ...]:
        return tuple(len(s.layers) for s in self.plan.stages)

    def as_candidate(self, cluster: Cluster) -> Candidate:
        """The planners' common :class:`~pipetrain.planners.contract.Candidate` of this option."""
        label = f"bapipe {self.method.value} on {'/'.join(self.placement.kinds)}"
        return Candidate(self.plan, self.iteration_s, cluster, label, self.infeasible)


@dataclass(frozen=True)
class BapipeResult:
    """What :func:`~pipetrain.planners.bapipe.explore.explore` found.

    Attributes:
        plan: the chosen plan, with its prediction.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it uses fewer devices).
        best: the chosen candidate.
        candidates: every simulated candidate: feasible ones fastest first, then infeasible ones.
        n_scored: partitions scored analytically.
        n_over_memory: (method, S, m, order) options for which no partition fits memory.
    """

    plan: Plan
    cluster: Cluster
    best: BapipeCandidate
    candidates: tuple[BapipeCandidate, ...]
    n_scored: int
    n_over_memory: int


@dataclass(frozen=True)
class Proposal:
    """A partition the DP found, with its analytic time; ``order`` keeps enumeration order for ties."""

    analytic_s: float
    order: int
    method: Method
    n_micro: int
    placement: Placement
    counts: tuple[int, ...]
    overlap: bool  # the comm model that proposed it
