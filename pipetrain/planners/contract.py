"""The planners' one contract: a :class:`PlanningProblem` in, a :class:`PlanningResult` out.

    problem = PlanningProblem(ModelRef.of(graph), CostModel(profile, cluster), batch_size=64,
                              optimizer="adam", constraints=Constraints(n_stages=4))
    result = run_planner("bapipe", problem)          # pipetrain.planners.registry
    result.plan, result.cluster, result.candidates   # the winner, where it runs, what was scored

Every planner of :data:`~pipetrain.planners.registry.PLANNERS` takes the same problem: the model
as planners see it (layer names in order and the fingerprint, :class:`ModelRef`), the cost model
(profiles and cluster), the batch, the optimizer whose state counts against memory, and the
user's constraints (method, stage count, micro-batch count, a base plan's stages, the GA's seed
and budget). It returns the chosen plan with its prediction, the cluster the plan's ranks index (a
sub-cluster when the plan leaves devices idle) and every candidate it scored, fastest first, with
a planner-specific ``report`` that :mod:`pipetrain.viz.plan_tables` knows how to show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import batch_norms
from pipetrain.plan.memory import OptimizerName, check_optimizer
from pipetrain.plan.methods import Method, MethodParams
from pipetrain.plan.plan import Plan

if TYPE_CHECKING:
    from pipetrain.graph.layer_graph import LayerGraph
    from pipetrain.planners.microbatch.ga import GAConfig

__all__ = ["RECOMPUTE_CHOICES", "Candidate", "Constraints", "ModelRef", "PlanningProblem", "PlanningResult",
           "RecomputeChoice", "rank_key"]

RecomputeChoice = Literal["auto", "none", "all"]
"""Which stages recompute (activation checkpointing, :attr:`~pipetrain.plan.plan.StagePlan.recompute`):
``auto`` those the planner finds over memory (:mod:`pipetrain.planners.recompute`), ``none`` none
by choice, ``all`` every stage."""

RECOMPUTE_CHOICES: tuple[RecomputeChoice, ...] = ("auto", "none", "all")


@dataclass(frozen=True)
class ModelRef:
    """The model as planners see it: its name, fingerprint and layers in order.

    Attributes:
        name: the model's name (goes into the plan; a zoo name lets ``train --plan`` rebuild it).
        fingerprint: ``LayerGraph.fingerprint()``; empty for a synthetic problem.
        layer_names: the layers ``L`` of them, in order.
        edges: the layer edges of a DAG model (``LayerGraph.edges``), empty for a chain: the
            GraphPipe planner partitions along them, the others linearise the model.
        smallest_microbatch: the fewest samples a micro-batch may have: 2 when a BatchNorm sees
            one value per channel of a sample and so cannot train on one
            (:class:`~pipetrain.graph.batch_norm.BatchNorms`), else 1.
    """

    name: str
    fingerprint: str
    layer_names: tuple[str, ...]
    edges: tuple[tuple[str, str], ...] = ()
    smallest_microbatch: int = 1

    @classmethod
    def of(cls, graph: LayerGraph) -> ModelRef:
        return cls(graph.name, graph.fingerprint(), tuple(graph.names), () if graph.is_chain else tuple(graph.edges),
                   batch_norms(graph).smallest_microbatch)

    @classmethod
    def of_plan(cls, plan: Plan) -> ModelRef:
        """The model a plan was made for, as far as the plan knows it (its stages' layers)."""
        return cls(plan.model, plan.model_fingerprint, tuple(name for s in plan.stages for name in s.layers))

    @classmethod
    def synthetic(cls, layer_names: Sequence[str], name: str = "synthetic") -> ModelRef:
        """A model known only by its layer names (tests, benchmarks on hand-made profiles)."""
        return cls(name, "", tuple(layer_names))


@dataclass(frozen=True)
class Constraints:
    """What the user fixed; None leaves the choice to the planner.

    Attributes:
        method: the method the planner plans (one of its :attr:`~pipetrain.planners.spec.PlannerSpec.methods`;
            None: it searches them; ``pipedream`` asks the ``pipedream`` planner for the PipeDream DP's
            steady-state objective).
        n_stages: the stage count (``balanced``, ``bapipe``, ``local``; default one stage per device).
        n_micro: the equal micro-batch count (``balanced``, ``local``; default: search).
        base: a plan whose stages (layers, ranks) a micro-batch planner keeps; default the plan its
            :attr:`~pipetrain.planners.spec.PlannerSpec.base` rule names (the ``balanced`` planner's best).
        memory_cap: keep each stage within its device's memory: micro-batch planners cap their sizes,
            the balanced and interleaved planners rank a candidate that does not fit last.
        seed: the genetic algorithms' seed.
        ga: the genetic algorithms' budget (population, generations).
        virtual_stages: model chunks per rank (``interleaved``; default: search).
        allow_async: ``auto`` may also pick the asynchronous methods (``pipedream``, ``2bw``;
            docs/algorithms.md §3.5–3.6), which change the optimizer's semantics (stale weights).
        params: the planned method's own parameters (:class:`~pipetrain.plan.methods.LocalParams` for
            the ``local`` planner: the auxiliary heads and the queue depth); None: the method's defaults.
        recompute: which stages recompute (:data:`RecomputeChoice`): ``auto`` lets the planner recompute
            the stages of a plan over memory (with the memory cap), ``none`` keeps every stage's
            activations (a stage whose two partitions differ still recomputes), ``all`` recomputes
            every stage.
        time_budget_s: ``auto``'s planning-time budget in seconds: once it is spent and a plan that fits
            is in hand, auto starts no further run and reports the rest as skipped
            (:func:`~pipetrain.planners.auto.plan_auto`); None: no budget, every run.
    """

    method: Method | None = None
    n_stages: int | None = None
    n_micro: int | None = None
    base: Plan | None = None
    memory_cap: bool = True
    seed: int = 0
    ga: GAConfig | None = None
    virtual_stages: int | None = None
    allow_async: bool = False
    params: MethodParams | None = None
    recompute: RecomputeChoice = "auto"
    time_budget_s: float | None = None

    def __post_init__(self) -> None:
        if self.time_budget_s is not None and not 0 < self.time_budget_s < math.inf:
            raise UserError(f"a time budget of {self.time_budget_s} s; give a number of seconds > 0, or None for "
                            "no budget")

    def given(self) -> tuple[str, ...]:
        """The names of the constraints set away from their defaults."""
        defaults = Constraints()
        return tuple(f.name for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name))


@dataclass(frozen=True)
class PlanningProblem:
    """One planning problem.

    Attributes:
        model: layers and fingerprint (:meth:`ModelRef.of` a LayerGraph).
        cost: profiles (one per device kind for mixed clusters) and the cluster.
        batch_size: samples per mini-batch ``B``.
        optimizer: whose state counts against device memory (:func:`~pipetrain.plan.memory.parameter_copies`).
        constraints: what the user fixed.
        progress: show progress bars on stderr.
    """

    model: ModelRef
    cost: CostModel
    batch_size: int
    optimizer: OptimizerName = "sgd"
    constraints: Constraints = field(default_factory=Constraints)
    progress: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UserError(f"batch_size is {self.batch_size}; it must be at least 1")
        if not self.model.layer_names:
            raise UserError(f"model {self.model.name!r} has no layers to plan")
        check_optimizer(self.optimizer)
        self._check_smallest()

    def _check_smallest(self) -> None:
        """Every micro-batch can hold the model's smallest trainable one (BatchNorm: 2 samples)."""
        smallest, m = self.model.smallest_microbatch, self.constraints.n_micro
        if smallest == 1:
            return
        why = f"model {self.model.name!r} has a BatchNorm that cannot train on 1 sample"
        if self.batch_size < smallest:
            raise UserError(f"{why}; use a batch of at least {smallest}")
        if m is not None and self.batch_size // m < smallest:
            raise UserError(f"{why}, and {m} micro-batches of batch {self.batch_size} make some of 1; use at most "
                            f"{self.batch_size // smallest} micro-batches")

    @property
    def layer_names(self) -> tuple[str, ...]:
        return self.model.layer_names

    @property
    def smallest_microbatch(self) -> int:
        """The fewest samples a micro-batch may have (:attr:`ModelRef.smallest_microbatch`)."""
        return self.model.smallest_microbatch


@dataclass(frozen=True)
class Candidate:
    """One scored option.

    Attributes:
        plan: the plan, with its :class:`~pipetrain.plan.plan.Prediction`.
        iteration_s: its predicted iteration time (inf when it has none).
        cluster: the cluster its ranks index; None: the problem's.
        label: what the planner calls it (e.g. ``"pipedream 15-1"``, a planner's name for ``auto``).
        infeasible: why it cannot run (over memory...); empty when it can.
    """

    plan: Plan
    iteration_s: float
    cluster: Cluster | None = None
    label: str = ""
    infeasible: str = ""

    @property
    def feasible(self) -> bool:
        return not self.infeasible


def rank_key(c: Candidate) -> tuple[bool, float, int, int]:
    """Feasible first, then fastest; among equally fast plans (to 3 significant digits), less
    activation memory, then fewer micro-batches: GPipe and 1F1B often tie in time, and 1F1B holds
    fewer activations."""
    peak = max(c.plan.prediction.peak_memory_bytes, default=0) if c.plan.prediction else 0
    finite = math.isfinite(c.iteration_s) and c.iteration_s > 0
    digits = 3 - (math.floor(math.log10(c.iteration_s)) + 1 if finite else 0)
    return (not c.feasible, round(c.iteration_s, digits) if finite else c.iteration_s, peak,
            len(c.plan.stages[0].forward_sizes))


@dataclass(frozen=True)
class PlanningResult:
    """A planner's answer.

    Attributes:
        planner: the registry name of the planner that produced it.
        plan: the chosen plan, with its prediction.
        cluster: the cluster ``plan``'s ranks index (a sub-cluster when it leaves devices idle).
        candidates: every candidate scored, feasible ones fastest first (:func:`rank_key`).
        report: the planner's own account (e.g. BaPipe's exploration, ``auto``'s per-planner
            outcomes), shown by :func:`pipetrain.viz.plan_tables.result_tables`; None for none.
        within_noise: the feasible candidates predicted within the profile's noise of the fastest,
            fastest first, when there are two or more; ``plan`` is then the most robust of them
            (:func:`pipetrain.planners.noise.within_noise`).
        noise: the profile's relative spread the choice allowed for (0.1: ±10%); None: none known.
    """

    planner: str
    plan: Plan
    cluster: Cluster
    candidates: tuple[Candidate, ...]
    report: object | None = None
    within_noise: tuple[Candidate, ...] = ()
    noise: float | None = None
