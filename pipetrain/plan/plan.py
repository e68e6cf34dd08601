"""Plan: how a model is cut into stages, placed on ranks and fed micro-batches (docs/architecture.md §2).

A plan is a saved, hand-editable JSON artefact; a planner's output and a hand-written plan have the
same type and go through the same :func:`Plan.validate` (STYLE.md L7).

Micro-batches are *size vectors*: stage ``k`` splits the ``B`` samples of a mini-batch, in order,
into ``forward_sizes[k]`` for forward and ``backward_sizes[k]`` for backward (each sums to ``B``).
GPipe uses one vector everywhere; 1F1B lets each stage have its own vector, used for forward and
backward alike (unequal micro-batches under a 1F1B order, :func:`~pipetrain.schedule.one_f_one_b.
one_f_one_b_orders`); UMPIPE's ``uedp`` gives each stage its own forward and backward vectors.

Recompute (activation checkpointing, docs/algorithms.md §2.6) is per stage: a recomputing stage keeps only its
*inputs* during forward and re-runs forward in backward (before its B under a split backward), trading a forward's
time for its activations' memory. A stage recomputes when its :attr:`StagePlan.recompute` is set (by hand or by a
planner under memory pressure) and always when its backward sizes differ from its forward sizes, since it cannot
back-propagate part of a forward micro-batch's autograd graph. :meth:`Plan.recomputes` is the one question the
simulator, the memory model, the vectorised evaluator and the runtime ask.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from pipetrain.errors import UserError
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.methods import METHODS, Method, MethodParams, MethodSpec, WeightPolicy
from pipetrain.plan.placement import Placement, local_edges
from pipetrain.profile.precision import Precision

__all__ = [
    "MAX_BATCH_SIZE",
    "Plan",
    "PlanSources",
    "Prediction",
    "StagePlan",
    "equal_sizes",
    "ranges",
]


MAX_BATCH_SIZE = 1 << 20
"""The most samples a mini-batch may have: schedules are checked sample by sample."""


def equal_sizes(batch: int, n_micro: int) -> tuple[int, ...]:
    """``n_micro`` sizes summing to ``batch`` that differ by at most one (larger first).

    >>> equal_sizes(10, 4)
    (3, 3, 2, 2)
    """
    if not 1 <= n_micro <= batch:
        raise UserError(
            f"cannot split a batch of {batch} into {n_micro} micro-batches; "
            f"choose between 1 and {batch}"
        )
    q, r = divmod(batch, n_micro)
    return tuple(q + 1 if i < r else q for i in range(n_micro))


def ranges(sizes: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Sample ranges ``[lo, hi)`` of consecutive micro-batches of the given sizes."""
    ends = tuple(itertools.accumulate(sizes))
    return tuple(zip((0, *ends[:-1]), ends, strict=True))


@dataclass(frozen=True)
class StagePlan:
    """One stage.

    Attributes:
        layers: names of the stage's layers, in execution order.
        ranks: the ranks that run it (several for a replicated stage).
        forward_sizes: forward micro-batch sizes; sum to the batch.
        backward_sizes: backward micro-batch sizes; sum to the batch.
        recompute: keep only the stage's inputs in forward and re-run its forward in backward
            (activation checkpointing); a stage whose two size vectors differ recomputes regardless
            (:meth:`Plan.recomputes`).
    """

    layers: tuple[str, ...]
    ranks: tuple[int, ...]
    forward_sizes: tuple[int, ...]
    backward_sizes: tuple[int, ...]
    recompute: bool = False

    @property
    def label(self) -> str:
        """Its layer count, and its replicas when it runs on several ranks: ``"5"``, ``"5×3"``."""
        return f"{len(self.layers)}×{len(self.ranks)}" if len(self.ranks) > 1 else str(len(self.layers))


@dataclass(frozen=True)
class Prediction:
    """What the planner predicted for this plan."""

    iteration_s: float
    bubble_fraction: float
    peak_memory_bytes: tuple[int, ...]
    basis: str  # e.g. "profile measured on cpu, cluster local-2"


@dataclass(frozen=True)
class PlanSources:
    """The measurements a plan was made with, saved beside it: file names relative to the plan
    file's folder (a plan moved with its folder still finds them), or absolute.

    Attributes:
        profile: the profile JSON (``plan.profile.json``); None: none saved (profiles per device kind,
            estimated again from the cluster).
        cluster: the cluster JSON (``plan.cluster.json``) or the cluster spec YAML it was planned on.
    """

    profile: str | None
    cluster: str | None


@dataclass(frozen=True)
class Plan:
    """A complete pipeline plan.

    Attributes:
        model: the model's name; a zoo name lets ``pipetrain train --plan`` rebuild it.
        model_fingerprint: ``LayerGraph.fingerprint()`` of the model it was made for.
        batch_size: samples per mini-batch (per optimizer step).
        method: the schedule family; what it is, :attr:`spec` (:data:`~pipetrain.plan.methods.METHODS`).
        stages: the stages, in pipeline order.
        edges: stage-graph edges ``(src, dst)``; empty means the chain 0 -> 1 -> ... . Method
            ``graph`` (GraphPipe) takes any DAG whose edges go from lower to higher stages and whose
            last stage is the only sink; a stage without predecessors reads the model input.
        weights: weight versioning policy, one of the method's (:attr:`MethodSpec.weights`).
        prediction: the simulated time the plan was chosen with, if any.
        precision: the numeric precision the plan trains at (:mod:`pipetrain.profile.precision`):
            ``fp32``, or mixed ``bf16``/``fp16`` (float32 master weights, messages in the compute dtype).
        params: the method's own parameters, of its :attr:`MethodSpec.params` type (local learning's
            heads and queue depth, :class:`~pipetrain.plan.methods.LocalParams`). Left at the empty
            default (or another method's defaults, as after ``replace(plan, method=...)``), a method whose
            parameters all have defaults gets those.
        optimizer: the optimizer the plan was priced for (its STEP's time and state's memory,
            :mod:`pipetrain.profile.optimizer_step`); ``sgd`` by default.
        clip_grad_norm: whether the plan was priced for clipping the gradient norm (each STEP's norm,
            and its all-reduce over the ranks; :meth:`~pipetrain.cost.CostModel.clip_allreduce_s`).
        measurements: the profile and cluster the plan was made with (``pipetrain plan`` saves them
            beside it; ``simulate`` and ``train`` reuse them); None: not recorded.
    """

    model: str
    model_fingerprint: str
    batch_size: int
    method: Method
    stages: tuple[StagePlan, ...]
    edges: tuple[tuple[int, int], ...] = field(default=())
    weights: WeightPolicy = WeightPolicy.SYNC
    prediction: Prediction | None = None
    params: MethodParams = field(default_factory=MethodParams)
    precision: Precision = "fp32"
    optimizer: OptimizerName = "sgd"
    clip_grad_norm: bool = False
    measurements: PlanSources | None = None

    def __post_init__(self) -> None:
        spec = METHODS[self.method]
        if type(self.params) is spec.params:
            return
        try:
            empty = self.params == type(self.params)()  # carries nothing: the method's own defaults apply
        except TypeError:  # some field has no default: it carries something
            empty = False
        default = spec.default_params() if empty else None
        if default is not None:
            object.__setattr__(self, "params", default)

    # ---- derived ----------------------------------------------------------------------------

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def n_ranks(self) -> int:
        return len({r for s in self.stages for r in s.ranks})

    @property
    def spec(self) -> MethodSpec:
        """What the plan's method is: its traits (:data:`~pipetrain.plan.methods.METHODS`)."""
        return METHODS[self.method]

    @property
    def placement(self) -> Placement:
        """How the method places stages on ranks: looping (interleaved), V (zbv) or one stage per rank."""
        return self.spec.placement

    @property
    def virtual_stages(self) -> int:
        """Stages per rank: ``v`` under a multi-stage placement (model chunks: looping ``v``, V 2), else 1."""
        return self.n_stages // self.n_ranks if self.placement is not Placement.SINGLE else 1

    @property
    def local_edges(self) -> frozenset[tuple[int, int]]:
        """Stage edges whose two stages run on the same rank (V: ``(R − 1, R)``): no message, a local hand-off."""
        return local_edges(self.stage_edges, [s.ranks for s in self.stages])

    def stages_of_rank(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` runs, in increasing order: one, or ``v`` under a multi-stage method."""
        found = tuple(k for k, stage in enumerate(self.stages) if rank in stage.ranks)
        if not found:
            raise UserError(f"rank {rank} runs no stage of this plan; the plan uses {self.n_ranks} ranks")
        return found

    @property
    def stage_edges(self) -> tuple[tuple[int, int], ...]:
        return self.edges or tuple((k, k + 1) for k in range(self.n_stages - 1))

    def stage_predecessors(self, stage: int) -> tuple[int, ...]:
        """The stages ``stage`` receives activations from, in increasing order."""
        return tuple(sorted(a for a, b in self.stage_edges if b == stage))

    def stage_successors(self, stage: int) -> tuple[int, ...]:
        """The stages ``stage`` sends activations to, in increasing order."""
        return tuple(sorted(b for a, b in self.stage_edges if a == stage))

    @property
    def rank_stages(self) -> tuple[int, ...]:
        """The stage each rank runs, indexed by rank."""
        return tuple(self.stage_of_rank(r) for r in range(self.n_ranks))

    def recomputes(self, stage: int) -> bool:
        """Whether ``stage`` keeps only its inputs in forward and re-runs forward in backward: its
        :attr:`StagePlan.recompute` is set, or its backward sizes differ from its forward sizes."""
        s = self.stages[stage]
        return s.recompute or s.forward_sizes != s.backward_sizes

    @property
    def recompute_stages(self) -> tuple[int, ...]:
        """The stages whose :attr:`StagePlan.recompute` is set (chosen, not forced by unequal sizes)."""
        return tuple(k for k, s in enumerate(self.stages) if s.recompute)

    def with_recompute(self, stages: Iterable[int] | None = None) -> Plan:
        """The plan with :attr:`StagePlan.recompute` set on exactly ``stages`` (default: every stage;
        ``()``: none), its prediction dropped."""
        chosen = set(range(self.n_stages) if stages is None else stages)
        return replace(self, stages=tuple(replace(s, recompute=k in chosen) for k, s in enumerate(self.stages)),
                       prediction=None)

    def replica_rank(self, stage: int, microbatch: int) -> int:
        """The rank that runs ``microbatch`` of ``stage``: replicas take micro-batches round-robin,
        ``ranks[microbatch % len(ranks)]`` (PipeDream's 1F1B-RR, docs/algorithms.md §3.4, on a flush schedule)."""
        ranks = self.stages[stage].ranks
        return ranks[microbatch % len(ranks)]

    @property
    def asynchronous(self) -> bool:
        """Whether the method runs batches without a flush, on several weight versions (pipedream, 2bw)."""
        return not self.spec.flush

    def repeated(self, batches: int) -> Plan:
        """The plan of ``batches`` consecutive mini-batches seen as one of ``batches · B`` samples.

        An asynchronous method's schedule spans the run without a flush; its sample ranges index this
        run-long batch (batch ``t`` is samples ``[t·B, (t+1)·B)``), so the communication pass and the
        validator apply to it unchanged.
        """
        stages = tuple(replace(s, forward_sizes=s.forward_sizes * batches, backward_sizes=s.backward_sizes * batches)
                       for s in self.stages)
        return replace(self, batch_size=self.batch_size * batches, stages=stages)

    @property
    def replicated(self) -> bool:
        """Whether some stage runs on more than one rank (data parallelism inside the stage)."""
        return any(len(s.ranks) > 1 for s in self.stages)

    def stage_of_rank(self, rank: int) -> int:
        """The stage ``rank`` runs (under method ``interleaved``, its first: see :meth:`stages_of_rank`)."""
        return self.stages_of_rank(rank)[0]

    def with_prediction(self, prediction: Prediction) -> Plan:
        return replace(self, prediction=prediction)

    def run_by(self, method: Method, vertical_sync: bool = False, params: MethodParams | None = None) -> Plan:
        """The same stages and micro-batches run by ``method``, with its default weight policy
        (``vertical_sync`` picks :attr:`WeightPolicy.VERTICAL_SYNC` where the method runs it) and
        ``params`` (default: the method's defaults), validated.

        Raises:
            UserError: vertical sync for a method without it, or a plan the method cannot run.
        """
        spec = METHODS[method]
        if vertical_sync and WeightPolicy.VERTICAL_SYNC not in spec.weights:
            owners = " or ".join(m.value for m, s in METHODS.items() if WeightPolicy.VERTICAL_SYNC in s.weights)
            raise UserError(f"--vertical-sync applies to --method {owners}, not {method.value}; drop it")
        weights = WeightPolicy.VERTICAL_SYNC if vertical_sync else spec.weights[0]
        plan = replace(self, method=method, weights=weights, params=params or MethodParams(), prediction=None)
        plan.validate()
        return plan

    # ---- validation (pipetrain.plan.validation) --------------------------------------------

    def validate(self, layer_names: Sequence[str] | None = None, fingerprint: str | None = None) -> None:
        """Check the plan's own consistency against its method's traits, and against a model if given
        (:func:`~pipetrain.plan.validation.validate_plan`).

        Raises:
            UserError: naming the stage and what to change.
        """
        from pipetrain.plan.validation import validate_plan  # the rules build on this module

        validate_plan(self, layer_names, fingerprint)

    # ---- JSON (pipetrain.plan.plan_json) -----------------------------------------------------

    def to_json(self) -> str:
        """The plan as JSON text (:func:`~pipetrain.plan.plan_json.plan_to_json`)."""
        from pipetrain.plan.plan_json import plan_to_json  # plan_json builds on this module

        return plan_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Parse a plan; any malformation raises :class:`UserError` naming the field
        (:func:`~pipetrain.plan.plan_json.plan_from_json`)."""
        from pipetrain.plan.plan_json import plan_from_json

        return plan_from_json(text)
