"""Plan: how a model is cut into stages, placed on ranks and fed micro-batches (docs/architecture.md §2).

A plan is a saved, hand-editable JSON artefact; a planner's output and a hand-written plan have the
same type and go through the same :func:`Plan.validate` (STYLE.md L7).

Micro-batches are *size vectors*: stage ``k`` splits the ``B`` samples of a mini-batch, in order,
into ``forward_sizes[k]`` for forward and ``backward_sizes[k]`` for backward (each sums to ``B``).
GPipe uses one vector everywhere; 1F1B lets each stage have its own vector, used for forward and
backward alike (unequal micro-batches under a 1F1B order, :func:`~pipetrain.schedule.generators.
one_f_one_b_orders`); UMPIPE's ``uedp`` gives each stage its own forward and backward vectors.

Recompute (docs/algorithms.md §2.6): a stage whose backward sizes differ from its forward sizes cannot back-propagate
part of a forward micro-batch's autograd graph, so it keeps only its *inputs* during forward and re-runs forward per
backward micro-batch. :meth:`Plan.recomputes` says which stages do: those, and every stage when the plan's
``recompute`` flag is set. The simulator, the vectorised evaluator and the runtime all follow it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_KINDS
from pipetrain.plan.placement import Placement, local_edges, placed_ranks

__all__ = [
    "ASYNC_WEIGHTS",
    "DEFAULT_QUEUE_DEPTH",
    "LOOPING_METHODS",
    "MAX_BATCH_SIZE",
    "MULTI_STAGE_METHODS",
    "SPLIT_METHODS",
    "V_METHODS",
    "Method",
    "Plan",
    "Prediction",
    "StagePlan",
    "WeightPolicy",
    "equal_sizes",
    "ranges",
]


MAX_BATCH_SIZE = 1 << 20
"""The most samples a mini-batch may have: schedules are checked sample by sample."""

DEFAULT_QUEUE_DEPTH = 2
"""Method ``local``: messages a link between two stages holds before its sender waits."""


class Method(str, Enum):
    """The methods of docs/architecture.md §4."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    PIPEDREAM = "pipedream"
    TWO_BW = "2bw"
    UEDP = "uedp"
    GRAPH = "graph"
    LOCAL = "local"
    INTERLEAVED = "interleaved"
    ZB1 = "zb1"  # ZB-H1 (Qi et al. 2024): backward split into B (input gradients) and W (weight gradients)
    ZB2 = "zb2"  # ZB-H2 (the same paper): zb1's split backward with twice the in-flight micro-batches
    INTERLEAVED_ZB = "interleaved-zb"  # interleaved 1F1B with zb1's split backward (pipetrain's own combination)
    ZBV = "zbv"  # ZB-V (Qi et al. 2024 §6): two chunks per rank in a V, split backward


LOOPING_METHODS = (Method.INTERLEAVED, Method.INTERLEAVED_ZB)
"""Methods whose ranks each run ``v`` stages, stage ``s`` on rank ``s mod R`` (looping placement)."""

V_METHODS = (Method.ZBV,)
"""Methods whose ranks each run 2 stages in the V placement (:mod:`pipetrain.plan.placement`)."""

MULTI_STAGE_METHODS = (*LOOPING_METHODS, *V_METHODS)
"""Methods whose ranks each run several stages (model chunks), placed by the method."""

SPLIT_METHODS = (Method.ZB1, Method.ZB2, Method.INTERLEAVED_ZB, Method.ZBV)
"""Methods that split every backward into B (input gradients) and W (weight gradients)."""


class WeightPolicy(str, Enum):
    """How weights are versioned between forward and backward."""

    SYNC = "sync"  # one version, flush per batch
    STASH = "stash"  # PipeDream weight stashing
    VERTICAL_SYNC = "vertical-sync"  # stashing, with the version chosen at stage 0 on every stage
    TWO_BW = "2bw"  # PipeDream-2BW double buffering
    LOCAL = "local"  # local losses, no cross-stage gradient


ASYNC_WEIGHTS: dict[Method, tuple[WeightPolicy, ...]] = {
    Method.PIPEDREAM: (WeightPolicy.STASH, WeightPolicy.VERTICAL_SYNC),
    Method.TWO_BW: (WeightPolicy.TWO_BW,),
}
"""The asynchronous methods (no flush between batches, docs/algorithms.md §2.9) and the weight policies each runs."""


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


def _layer_difference(planned: list[str], model: list[str]) -> str:
    """What differs, e.g. ``"missing 'block2'"``, ``"'x' is not a layer of the model"``,
    ``"'block1' twice"`` or ``"at position 3 the plan has 'block3' where the model has 'block2'"``."""
    missing = [n for n in model if n not in planned]
    unknown = [n for n in planned if n not in model]
    repeated = sorted({n for n in planned if planned.count(n) > 1})
    parts = ([f"missing {', '.join(map(repr, missing[:5]))}"] if missing else []) + (
        [f"{', '.join(map(repr, unknown[:5]))} not in the model"] if unknown else []) + (
        [f"{', '.join(map(repr, repeated[:5]))} more than once"] if repeated else [])
    if parts:
        return "; ".join(parts)
    i = next(i for i, (a, b) in enumerate(zip(planned, model, strict=True)) if a != b)
    return f"at position {i} the plan has {planned[i]!r} where the model has {model[i]!r}"


@dataclass(frozen=True)
class StagePlan:
    """One stage.

    Attributes:
        layers: names of the stage's layers, in execution order.
        ranks: the ranks that run it (several for a replicated stage).
        forward_sizes: forward micro-batch sizes; sum to the batch.
        backward_sizes: backward micro-batch sizes; sum to the batch.
    """

    layers: tuple[str, ...]
    ranks: tuple[int, ...]
    forward_sizes: tuple[int, ...]
    backward_sizes: tuple[int, ...]

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
class Plan:
    """A complete pipeline plan.

    Attributes:
        model: the model's name; a zoo name lets ``pipetrain train --plan`` rebuild it.
        model_fingerprint: ``LayerGraph.fingerprint()`` of the model it was made for.
        batch_size: samples per mini-batch (per optimizer step).
        method: the schedule family.
        stages: the stages, in pipeline order.
        edges: stage-graph edges ``(src, dst)``; empty means the chain 0 -> 1 -> ... . Method
            ``graph`` (GraphPipe) takes any DAG whose edges go from lower to higher stages and whose
            last stage is the only sink; a stage without predecessors reads the model input.
        recompute: re-run forward during backward instead of keeping activations, on every stage
            (stages with unequal forward and backward partitions recompute regardless).
        weights: weight versioning policy (``local`` exactly for method ``local``).
        prediction: the simulated time the plan was chosen with, if any.
        aux: method ``local``: the auxiliary heads of every stage but the last (``linear``, ``dgl`` or
            ``infopro``, :mod:`pipetrain.graph.aux_heads`); None for the other methods.
        queue_depth: method ``local``: activation messages a link holds before its sender waits (the
            bounded queue between stages, docs/algorithms.md §6).
    """

    model: str
    model_fingerprint: str
    batch_size: int
    method: Method
    stages: tuple[StagePlan, ...]
    edges: tuple[tuple[int, int], ...] = field(default=())
    recompute: bool = False
    weights: WeightPolicy = WeightPolicy.SYNC
    prediction: Prediction | None = None
    aux: str | None = None
    queue_depth: int = DEFAULT_QUEUE_DEPTH

    # ---- derived ----------------------------------------------------------------------------

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def n_ranks(self) -> int:
        return len({r for s in self.stages for r in s.ranks})

    @property
    def placement(self) -> Placement:
        """How the method places stages on ranks: looping (interleaved), V (zbv) or one stage per rank."""
        if self.method in LOOPING_METHODS:
            return Placement.LOOPING
        return Placement.V if self.method in V_METHODS else Placement.SINGLE

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
        """Whether ``stage`` keeps only its inputs in forward and re-runs forward in backward."""
        s = self.stages[stage]
        return self.recompute or s.forward_sizes != s.backward_sizes

    def replica_rank(self, stage: int, microbatch: int) -> int:
        """The rank that runs ``microbatch`` of ``stage``: replicas take micro-batches round-robin,
        ``ranks[microbatch % len(ranks)]`` (PipeDream's 1F1B-RR, docs/algorithms.md §3.4, on a flush schedule)."""
        ranks = self.stages[stage].ranks
        return ranks[microbatch % len(ranks)]

    @property
    def asynchronous(self) -> bool:
        """Whether the method runs batches without a flush, on several weight versions (pipedream, 2bw)."""
        return self.method in ASYNC_WEIGHTS

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

    def run_by(self, method: Method, vertical_sync: bool = False) -> Plan:
        """The same stages and micro-batches run by ``method``, with its weight policy (asynchronous
        methods: :data:`ASYNC_WEIGHTS`; ``vertical_sync`` picks pipedream's vertical sync), validated.

        Raises:
            UserError: vertical sync for a method other than pipedream, or a plan the method cannot run.
        """
        if vertical_sync and method is not Method.PIPEDREAM:
            raise UserError(f"--vertical-sync applies to --method pipedream, not {method.value}; drop it")
        weights = ASYNC_WEIGHTS.get(method, (WeightPolicy.SYNC,))[1 if vertical_sync else 0]
        plan = replace(self, method=method, weights=weights, aux=None, prediction=None)
        plan.validate()
        return plan

    # ---- validation -------------------------------------------------------------------------

    def validate(self, layer_names: Sequence[str] | None = None, fingerprint: str | None = None) -> None:
        """Check the plan's own consistency, and against a model if given.

        Raises:
            UserError: naming the stage and what to change.
        """
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise UserError(f"batch_size is {self.batch_size}; it must be between 1 and {MAX_BATCH_SIZE}")
        if not self.stages:
            raise UserError("the plan has no stages; give at least one")
        for k, stage in enumerate(self.stages):
            self._validate_stage(k, stage)
        self._validate_edges()
        if self.replicated:
            self._validate_replicas()
        if self.method in SPLIT_METHODS and (self.recompute or self.edges):
            raise UserError(f"method {self.method.value} splits each kept forward graph into B and W on a chain of "
                            'stages; drop "recompute" and "edges" from the plan, or use method 1f1b (recompute) or '
                            "graph (a DAG)")
        self._validate_local()
        if self.asynchronous or self.weights not in (WeightPolicy.SYNC, WeightPolicy.LOCAL):
            self._validate_async()
        self._validate_ranks()
        if fingerprint is not None and self.model_fingerprint and fingerprint != self.model_fingerprint:
            raise UserError(
                f"this plan was made for another model (fingerprint {self.model_fingerprint}, the model "
                f"has {fingerprint}); re-plan with `pipetrain plan --model {self.model}`"
            )
        if layer_names is not None:
            planned = [name for s in self.stages for name in s.layers]
            if self.method is Method.GRAPH:  # stages of a DAG need not be consecutive (the graph checks the rest)
                planned = sorted(planned, key=lambda n: list(layer_names).index(n) if n in layer_names else -1)
            if planned != list(layer_names):
                raise UserError(f"the plan's stages do not cover the model's {len(layer_names)} layers once, in order: "
                                f"{_layer_difference(planned, list(layer_names))}; re-plan for this model")

    def _validate_stage(self, k: int, stage: StagePlan) -> None:
        if not stage.layers:
            raise UserError(f"stage {k} has no layers; give every stage at least one layer")
        if not stage.ranks:
            raise UserError(f"stage {k} has no ranks; give every stage at least one rank")
        for label, sizes in (("forward", stage.forward_sizes), ("backward", stage.backward_sizes)):
            if not sizes or min(sizes) < 1:
                raise UserError(f"stage {k}: {label} micro-batch sizes {list(sizes)} must all be >= 1")
            if sum(sizes) != self.batch_size:
                raise UserError(
                    f"stage {k}: {label} micro-batch sizes {list(sizes)} sum to {sum(sizes)} but the "
                    f"batch has {self.batch_size} samples; make them sum to {self.batch_size}"
                )
        if self.method in (Method.ONE_F_ONE_B, Method.GRAPH, Method.ZB1, Method.ZB2) and \
                stage.backward_sizes != stage.forward_sizes:
            raise UserError(
                f"stage {k}: method {self.method.value} needs the same micro-batch sizes for forward and backward "
                f"(forward {list(stage.forward_sizes)}, backward {list(stage.backward_sizes)}); use "
                "method 'uedp' for unequal forward and backward partitions"
            )
        if self.method is Method.GPIPE and (
            stage.forward_sizes != self.stages[0].forward_sizes or stage.backward_sizes != stage.forward_sizes
        ):
            raise UserError(
                f"stage {k}: method gpipe needs the same micro-batch sizes on every stage for forward "
                "and backward; use method 'uedp' (flush order) or '1f1b' for per-stage partitions"
            )

    def _validate_ranks(self) -> None:
        """Each of ranks 0..R-1 runs exactly one stage; under a multi-stage method every rank the same
        number of stages, placed as the method says (:mod:`pipetrain.plan.placement`)."""
        ranks = sorted(r for s in self.stages for r in s.ranks)
        if self.placement is Placement.SINGLE:
            if ranks != list(range(len(ranks))):
                raise UserError(f"stages use ranks {ranks}; each of ranks 0..{len(ranks) - 1} must run exactly one "
                                "stage")
            return
        n = self.n_ranks
        placed = placed_ranks(self.placement, self.n_stages, n)
        v_count = self.placement is not Placement.V or self.n_stages == 2 * n  # V: exactly 2 stages per rank
        if tuple(s.ranks for s in self.stages) != placed or self.n_stages % n or sorted(set(ranks)) != list(range(n)) \
                or not v_count:
            rule = "s mod R" if self.placement is Placement.LOOPING else "s (s < R) or 2R-1-s (s >= R), 2R stages"
            raise UserError(f"method {self.method.value} places stage s on rank {rule}, every rank the same number "
                            f"of stages (here {self.n_stages} stages on {n} ranks); give the stages the ranks "
                            f"{[list(r) for r in placed or ()]}")
        mixed = [k for k, s in enumerate(self.stages) if s.forward_sizes != s.backward_sizes]
        if mixed:  # each stage may cut the batch its own way (schedule/interleaved_unequal.py)
            raise UserError(f"method {self.method.value} needs each stage's backward sizes equal to its forward sizes "
                            f"(stage {mixed[0]} differs); give stage {mixed[0]} one partition for both")
        sizes = self.stages[0].forward_sizes
        if self.method in (Method.INTERLEAVED_ZB, Method.ZBV) and any(s.forward_sizes != sizes for s in self.stages):
            raise UserError(f"method {self.method.value} needs one partition for every stage (stage 0 has "
                            f"{list(sizes)}); use the same micro-batch sizes everywhere, or method interleaved for "
                            "per-stage ones")

    def _validate_edges(self) -> None:
        """Chain methods run the chain 0 -> 1 -> ...; method graph a DAG of stages in topological
        order with the last stage as its only sink (GraphPipe §3.2)."""
        n = self.n_stages
        chain = tuple((k, k + 1) for k in range(n - 1))
        if self.method is not Method.GRAPH:
            if self.edges and tuple(self.edges) != chain:
                raise UserError(f"the plan's stage edges {list(self.edges)} form a graph, not the chain 0 -> 1 -> ...; "
                                f"stages that form a DAG run with method graph, not {self.method.value}: set "
                                '"method": "graph" or remove "edges"')
            return
        edges = [tuple(e) for e in self.stage_edges]
        bad = [e for e in edges if not 0 <= e[0] < e[1] < n]
        if bad or len(set(edges)) != len(edges):
            raise UserError(f"method graph: stage edges {bad[:3] or edges} must each go from a lower to a higher stage "
                            f"of 0..{n - 1}, once; number the stages in a topological order")
        sinks = [k for k in range(n) if not self.stage_successors(k)]
        if sinks != [n - 1]:
            raise UserError(f"method graph: stages {sinks} have no successors; only the last stage (the one with the "
                            "model's last layer) may, so connect the others to a later stage")

    def _validate_local(self) -> None:
        """Method ``local`` goes with weight policy ``local``, heads and a queue depth; no other method has them."""
        local = self.method is Method.LOCAL
        if local != (self.weights is WeightPolicy.LOCAL):
            raise UserError(f"method {self.method.value} with weight policy {self.weights.value}: method local and "
                            'weights "local" go together; set both or neither')
        if local and (self.aux not in AUX_KINDS or self.queue_depth < 1):
            raise UserError(f"method local needs aux one of {', '.join(AUX_KINDS)} (has {self.aux!r}) and "
                            f"queue_depth >= 1 (has {self.queue_depth}); fix the plan or re-plan with --method local")
        if not local and self.aux is not None:
            raise UserError(f"method {self.method.value} trains end to end and takes no auxiliary heads; remove "
                            '"aux" or use method local')

    def _validate_replicas(self) -> None:
        """Replicated stages take whole micro-batches round-robin, so every stage must cut the batch
        the same way (a message then goes to exactly one replica) and have a micro-batch per replica."""
        if self.method not in (Method.GPIPE, Method.ONE_F_ONE_B, Method.PIPEDREAM, Method.GRAPH):
            raise UserError(
                f"method {self.method.value} cannot run replicated stages; use gpipe, 1f1b, pipedream or graph, or "
                "give every stage one rank"
            )
        sizes = self.stages[0].forward_sizes
        for k, stage in enumerate(self.stages):
            if stage.forward_sizes != sizes or stage.backward_sizes != sizes:
                raise UserError(
                    f"stage {k}: with replicated stages every stage needs the same micro-batch sizes for "
                    f"forward and backward (stage 0 has {list(sizes)}); use one partition for the whole plan"
                )
            if len(stage.ranks) > len(sizes):
                raise UserError(
                    f"stage {k} runs on {len(stage.ranks)} ranks but the batch has only {len(sizes)} "
                    f"micro-batches; use at least {len(stage.ranks)} micro-batches or fewer replicas"
                )

    def _validate_async(self) -> None:
        """An asynchronous method needs its weight policy, one partition for every stage and pass, and
        (2bw) at least as many micro-batches as stages; replicas need pipedream's stashing without
        vertical sync, a whole number of micro-batches per replica, and an unreplicated last stage."""
        allowed = ASYNC_WEIGHTS.get(self.method, ())
        if self.weights not in allowed:
            fix = f"set \"weights\" to {' or '.join(repr(w.value) for w in allowed)}" if allowed else \
                "set \"weights\" to 'sync' (versioned weights need method pipedream or 2bw)"
            raise UserError(f"method {self.method.value} cannot run weight policy {self.weights.value!r}; {fix}")
        sizes = self.stages[0].forward_sizes
        if any(s.forward_sizes != sizes or s.backward_sizes != sizes for s in self.stages):
            raise UserError(f"method {self.method.value} needs the same micro-batch sizes on every stage, for forward "
                            f"and backward (stage 0 has {list(sizes)}); use one partition for the whole plan")
        if self.method is Method.TWO_BW and len(sizes) < self.n_stages:
            raise UserError(f"method 2bw needs at least as many micro-batches as stages ({self.n_stages}), got "
                            f"{len(sizes)}; use more micro-batches or fewer stages")
        replicas = [len(s.ranks) for s in self.stages]
        if max(replicas) == 1:
            return
        if self.weights is WeightPolicy.VERTICAL_SYNC:
            raise UserError("vertical sync cannot run replicated stages (their versions advance at another rate); "
                            "drop --vertical-sync or give every stage one rank")
        if replicas[-1] > 1:
            raise UserError("method pipedream cannot replicate the last stage yet; give the last stage one rank")
        bad = [k for k, r in enumerate(replicas) if len(sizes) % r]
        if bad:
            raise UserError(f"stage {bad[0]} runs on {replicas[bad[0]]} ranks, which do not divide the {len(sizes)} "
                            "micro-batches; use a multiple of every stage's replica count")

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
