"""What a method is: one record per method, the only table of methods (docs/architecture.md §4).

    spec = METHODS[Method.ZB1]
    spec.backward is Backward.SPLIT          # every backward split into B and W
    spec.placement is Placement.SINGLE       # one stage per rank
    spec.sizes is SizeRule.PER_STAGE         # each stage its own partition, forward = backward
    plan.spec.flush                          # False for the asynchronous methods (pipedream, 2bw)

Everything outside this table and the schedule generators reads these *traits*, never a method's
name: the plan's validation, the memory model, forward-only evaluation, the simulator, the runtime's
choice of stage kernel, the planners' specs and the CLI's choices. A new method is a new row here and
a generator (:mod:`pipetrain.schedule.registry`).

The traits, per method::

    method          placement  graph  backward  weights              flush  grads  sizes      replicas  recompute
    gpipe           single     chain  fused     sync                 yes    cross  one        yes       yes
    1f1b            single     chain  fused     sync                 yes    cross  per-stage  yes       yes
    pipedream       single     chain  fused     stash, vertical-sync no     cross  one        yes       yes
    2bw             single     chain  fused     2bw                  no     cross  one        yes       yes
    uedp            single     chain  fused     sync                 yes    cross  per-pass   no        yes
    graph           single     dag    fused     sync                 yes    cross  per-stage  yes       yes
    local           single     chain  fused     local                yes    local  per-stage  no        no
    zb1, zb2        single     chain  split     sync                 yes    cross  per-stage  no        yes
    interleaved     looping    chain  fused     sync                 yes    cross  per-stage  no        yes
    interleaved-zb  looping    chain  split     sync                 yes    cross  one        no        yes
    zbv             V          chain  split     sync                 yes    cross  one        no        yes
    dualpipev       V          chain  split     sync                 yes    cross  one        no        yes

gpipe and uedp run every forward of a batch before any backward (``fill_drain``); pipedream and 2bw
are planned as a 1f1b plan when a planner does not plan them itself (``plan_as``), then run without
the flush.

A method's ``params`` type carries what only it needs (:class:`LocalParams`: the auxiliary heads and
the queue depth of local learning; :class:`ZeroBubbleParams`: the strict-memory variant of the
zero-bubble orders); the plan holds an instance (:attr:`pipetrain.plan.plan.Plan.params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from types import MappingProxyType
from typing import Any, ClassVar

from pipetrain.errors import UserError
from pipetrain.graph.aux_heads import AUX_KINDS
from pipetrain.plan.placement import Placement

__all__ = [
    "DEFAULT_QUEUE_DEPTH",
    "METHODS",
    "Backward",
    "LocalParams",
    "Method",
    "MethodParams",
    "MethodSpec",
    "SizeRule",
    "StageGraph",
    "WeightPolicy",
    "ZeroBubbleParams",
    "method_names",
    "methods_where",
]

DEFAULT_QUEUE_DEPTH = 2
"""Method ``local``: messages a link between two stages holds before its sender waits."""


class Method(str, Enum):
    """The methods of docs/architecture.md §4; what each is lives in :data:`METHODS`."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    PIPEDREAM = "pipedream"
    TWO_BW = "2bw"
    UEDP = "uedp"
    GRAPH = "graph"
    LOCAL = "local"
    INTERLEAVED = "interleaved"
    ZB1 = "zb1"
    ZB2 = "zb2"
    INTERLEAVED_ZB = "interleaved-zb"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"


class WeightPolicy(str, Enum):
    """How weights are versioned between forward and backward."""

    SYNC = "sync"  # one version, flush per batch
    STASH = "stash"  # PipeDream weight stashing
    VERTICAL_SYNC = "vertical-sync"  # stashing, with the version chosen at stage 0 on every stage
    TWO_BW = "2bw"  # PipeDream-2BW double buffering
    LOCAL = "local"  # local losses, no cross-stage gradient


class StageGraph(str, Enum):
    """The shape of a method's stage graph."""

    CHAIN = "chain"  # stage k feeds stage k + 1
    DAG = "dag"  # any DAG of stages in topological order, the last stage its only sink (GraphPipe)


class Backward(str, Enum):
    """How a method's schedule runs each backward."""

    FUSED = "fused"  # one B per micro-batch: input and weight gradients together
    SPLIT = "split"  # B (input gradients) and a later W (weight gradients), Qi et al. 2024


class SizeRule(str, Enum):
    """How a method's stages may cut the batch into micro-batches (size vectors, each summing to ``B``)."""

    ONE = "one"  # one partition for every stage, forward = backward
    PER_STAGE = "per-stage"  # each stage its own partition, forward = backward
    PER_PASS = "per-pass"  # each stage its own forward and its own backward partition (UMPIPE)


@dataclass(frozen=True)
class MethodParams:
    """A method's own parameters; this base is the empty set (most methods take none)."""

    what: ClassVar[str] = "parameters"
    """What they are, for messages (``"auxiliary heads or queue depth"``)."""

    @property
    def queue_bound(self) -> int | None:
        """Messages a link holds before its sender waits (bounded queues), or None: unbounded until STEP."""
        return None

    def to_json(self) -> dict[str, Any]:
        """The parameters as a JSON object (field name → value)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def check(self, method: str) -> None:
        """Refuse values the method cannot run, naming the field and the fix."""


@dataclass(frozen=True)
class LocalParams(MethodParams):
    """Local learning (PPLL, docs/algorithms.md §6).

    Attributes:
        aux: the auxiliary heads of every stage but the last (``linear``, ``dgl`` or ``infopro``,
            :mod:`pipetrain.graph.aux_heads`): each predicts the model's output from its stage's and is
            scored with the task's loss.
        queue_depth: activation messages a link holds before its sender waits (the bounded queue
            between stages).
    """

    what: ClassVar[str] = "auxiliary heads or queue depth"

    aux: str
    queue_depth: int = DEFAULT_QUEUE_DEPTH

    @property
    def queue_bound(self) -> int | None:
        return self.queue_depth

    def check(self, method: str) -> None:
        if self.aux not in AUX_KINDS or self.queue_depth < 1:
            raise UserError(f"method {method} needs aux one of {', '.join(AUX_KINDS)} (has {self.aux!r}) and "
                            f"queue_depth >= 1 (has {self.queue_depth}); fix the plan or re-plan with --method "
                            f"{method}")


@dataclass(frozen=True)
class ZeroBubbleParams(MethodParams):
    """The zero-bubble orders with a single partition per stage (ZB-H1, interleaved-zb).

    Attributes:
        strict_memory: the variant that holds no more activations and held gradients than 1F1B
            (fused backward) on every stage (:func:`~pipetrain.schedule.zero_bubble.strict_memory_sequences`).
    """

    what: ClassVar[str] = "strict-memory flag"

    strict_memory: bool = False


@dataclass(frozen=True)
class MethodSpec:
    """One method: the traits every other package reads (module docstring).

    Attributes:
        method: its name.
        paper: where it comes from (docs/architecture.md §4).
        summary: one line for help texts.
        placement: how its stages map to ranks (:class:`~pipetrain.plan.placement.Placement`).
        graph: a chain of stages, or a DAG.
        backward: fused, or split into B and W.
        weights: the weight policies it runs, its default first.
        flush: True when every batch ends in a flush; False for the asynchronous methods, whose
            schedule spans the run with weight versions.
        gradients_cross_stages: True when a stage's backward needs its successor's gradient; False
            for local learning (each stage trains on its own loss).
        sizes: how stages may cut the batch into micro-batches.
        replicas: stages may run on several ranks (data parallelism inside a stage).
        recompute: the plan's stages may recompute their forward in backward (activation
            checkpointing; under a split backward before B, the re-run's graph kept until W): every
            method whose stages back-propagate their successor's gradient; not local learning.
        microbatches_per_stage: needs at least as many micro-batches as stages (2BW's delay, DualPipeV's
            warm-up).
        loss_per_microbatch: every micro-batch is a mini-batch of its own: its loss is divided by its
            own size (PipeDream steps after every backward); else by the batch size.
        fill_drain: every forward of a batch runs before any backward (GPipe's order): a stage holds all
            its micro-batches' activations at once; else backwards interleave with forwards and hold
            fewer (1F1B: at most ``S − k`` micro-batches on stage ``k`` of ``S``).
        plan_as: an asynchronous method's flush twin: a planner that does not plan the method itself
            plans this one, whose stages and micro-batches the method then runs in its own order (the
            same order without the flush, :meth:`~pipetrain.plan.plan.Plan.run_by`); None for the others.
        params: the type of its parameters.
    """

    method: Method
    paper: str
    summary: str
    placement: Placement = Placement.SINGLE
    graph: StageGraph = StageGraph.CHAIN
    backward: Backward = Backward.FUSED
    weights: tuple[WeightPolicy, ...] = (WeightPolicy.SYNC,)
    flush: bool = True
    gradients_cross_stages: bool = True
    sizes: SizeRule = SizeRule.PER_STAGE
    replicas: bool = False
    recompute: bool = True
    microbatches_per_stage: bool = False
    loss_per_microbatch: bool = False
    fill_drain: bool = False
    plan_as: Method | None = None
    params: type[MethodParams] = MethodParams

    @property
    def name(self) -> str:
        return self.method.value

    @property
    def multi_stage(self) -> bool:
        """Each rank runs several stages (model chunks), placed by the method."""
        return self.placement is not Placement.SINGLE

    @property
    def synchronous_chain(self) -> bool:
        """A flush per batch, gradients across a chain of stages: a plan's stages and micro-batches
        can be run by any other such method (same layers and sizes, another order)."""
        return self.flush and self.gradients_cross_stages and self.graph is StageGraph.CHAIN

    def default_params(self) -> MethodParams | None:
        """The method's parameters at their defaults, or None when some have none (local's heads)."""
        try:
            return self.params()
        except TypeError:
            return None

    def params_from_json(self, data: Mapping[str, Any]) -> MethodParams:
        """Parse ``data`` (a plan file's ``params``) as this method's parameters.

        Raises:
            UserError: an unknown field, or a missing one without a default.
        """
        known = {f.name for f in fields(self.params)}
        given = dict(data)
        unknown = sorted(set(given) - known)
        if unknown:
            raise UserError(f"method {self.name} takes no parameter {', '.join(map(repr, unknown))} (it takes "
                            f"{', '.join(sorted(known)) or 'none'}); remove it from the plan's \"params\"")
        try:
            return self.params(**given)
        except TypeError as e:
            raise UserError(f"method {self.name}'s \"params\" are incomplete ({e}); re-plan with --method "
                            f"{self.name}") from None


_SPECS = (
    MethodSpec(Method.GPIPE, "GPipe (Huang et al. 2019)", "fill-drain, one partition everywhere",
               sizes=SizeRule.ONE, replicas=True, fill_drain=True),
    MethodSpec(Method.ONE_F_ONE_B, "PipeDream-Flush (Narayanan et al. 2021)",
               "one-forward-one-backward with a flush per batch", replicas=True),
    MethodSpec(Method.PIPEDREAM, "PipeDream (Narayanan et al. 2019)",
               "1F1B without a flush, weight stashing, a step per micro-batch",
               weights=(WeightPolicy.STASH, WeightPolicy.VERTICAL_SYNC), flush=False, sizes=SizeRule.ONE,
               replicas=True, loss_per_microbatch=True, plan_as=Method.ONE_F_ONE_B),
    MethodSpec(Method.TWO_BW, "PipeDream-2BW (Narayanan et al. 2021)",
               "1F1B without a flush, two weight versions, a step per batch",
               weights=(WeightPolicy.TWO_BW,), flush=False, sizes=SizeRule.ONE, replicas=True,
               microbatches_per_stage=True, plan_as=Method.ONE_F_ONE_B),
    MethodSpec(Method.UEDP, "UMPIPE", "fill-drain with each stage's own forward and backward partitions",
               sizes=SizeRule.PER_PASS, fill_drain=True),
    MethodSpec(Method.GRAPH, "GraphPipe (Jeon et al. 2025)", "1F1B over a DAG of stages",
               graph=StageGraph.DAG, replicas=True),
    MethodSpec(Method.LOCAL, "PPLL (Guo et al. 2024)",
               "local losses through auxiliary heads, bounded queues, no gradient between stages",
               weights=(WeightPolicy.LOCAL,), gradients_cross_stages=False, recompute=False, params=LocalParams),
    MethodSpec(Method.INTERLEAVED, "Megatron interleaved (Narayanan et al. 2021 §2.2)",
               "v model chunks per rank, looping placement", placement=Placement.LOOPING),
    MethodSpec(Method.ZB1, "Zero Bubble ZB-H1 (Qi et al. 2024)", "1F1B with backward split into B and deferred W",
               backward=Backward.SPLIT, params=ZeroBubbleParams),
    MethodSpec(Method.ZB2, "Zero Bubble ZB-H2 (Qi et al. 2024)", "zb1 with twice the warm-up forwards",
               backward=Backward.SPLIT),
    MethodSpec(Method.INTERLEAVED_ZB, "ours: interleaved with zb1's split backward",
               "v model chunks per rank, looping placement, backward split into B and W",
               placement=Placement.LOOPING, backward=Backward.SPLIT, sizes=SizeRule.ONE,
               params=ZeroBubbleParams),
    MethodSpec(Method.ZBV, "Zero Bubble ZB-V (Qi et al. 2024 §6)", "2 chunks per rank in a V, split backward",
               placement=Placement.V, backward=Backward.SPLIT, sizes=SizeRule.ONE),
    MethodSpec(Method.DUALPIPEV, "DualPipeV (DeepSeek-V3 §3.2.1, cut in half)",
               "2 chunks per rank in a V, a forward of one chunk paired with a backward of the other",
               placement=Placement.V, backward=Backward.SPLIT, sizes=SizeRule.ONE,
               microbatches_per_stage=True),
)

METHODS: Mapping[Method, MethodSpec] = MappingProxyType({s.method: s for s in _SPECS})
"""Every method's record, in docs/architecture.md §4's order."""


def methods_where(**traits: object) -> tuple[Method, ...]:
    """The methods whose traits equal the given ones, in table order: ``methods_where(flush=False)``."""
    return tuple(m for m, s in METHODS.items() if all(getattr(s, k) == v for k, v in traits.items()))


def method_names(methods: tuple[Method, ...] | None = None) -> tuple[str, ...]:
    """The methods' names (default every method's), for choices and messages."""
    return tuple(m.value for m in (METHODS if methods is None else methods))
