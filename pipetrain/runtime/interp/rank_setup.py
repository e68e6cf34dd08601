"""A rank's stage, built: its layers with their deterministic initial weights, its stage kernel
(chosen once, from the method's traits), its optimizer and the state the interpreter
(:mod:`pipetrain.runtime.interp.executor`) runs it with; and the stage's parameters read back under
the model's own names (checkpoints, results).

The kernel (:func:`stage_kernel`), from the plan's method record (:attr:`~pipetrain.plan.plan.Plan.spec`)::

    graph DAG                       DAG kernel (recomputing       :mod:`~pipetrain.runtime.interp.dag`
                                    where Plan.recomputes(stage))
    gradients stay in their stage   local-learning kernel         :mod:`~pipetrain.runtime.interp.local`
    otherwise, a chain kernel       (:mod:`~pipetrain.runtime.interp.chain`) with
        Plan.recomputes(stage)      F keeps only its inputs       :class:`~.keeping.Recompute`
        W actions in the program    B split into B and W          :class:`~.backward.SplitBackward`
        no flush                    weight versions               :class:`~.weights.VersionedWeights`
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.data import Loss, model_loss
from pipetrain.errors import UserError
from pipetrain.graph.dataflow import StageModule, chain_ports, chain_stage, port_spec
from pipetrain.graph.layer_graph import Layer, LayerGraph, TensorSpec
from pipetrain.plan.methods import StageGraph
from pipetrain.plan.plan import Plan, ranges
from pipetrain.runtime.interp.backward import FusedBackward, SplitBackward
from pipetrain.runtime.interp.chain import BackwardPass, ChainKernel, Keeping, WeightUse
from pipetrain.runtime.interp.context import LossTally, Range, RankContext, StageKernel
from pipetrain.runtime.interp.dag import DagKernel, DagPorts, dag_ports
from pipetrain.runtime.interp.keeping import KeepActivations, Recompute
from pipetrain.runtime.interp.local import local_kernel
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.ports import ChainPorts
from pipetrain.runtime.interp.precision import StagePrecision
from pipetrain.runtime.interp.transport import Transport
from pipetrain.runtime.interp.versions import WeightVersions
from pipetrain.runtime.interp.weights import CurrentWeights, VersionedWeights
from pipetrain.schedule.action import Action, ActionKind

__all__ = ["HEAD_PREFIX", "OptimizerFactory", "build_rank_context", "build_rank_contexts", "build_stage_module",
           "finish_pending_step", "head_state_dict", "reload_versions", "stage_kernel", "stage_specs",
           "stage_state_dict"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

HEAD_PREFIX = "aux"
"""Auxiliary heads' parameters are named ``aux{stage}.<name in the head>`` (local learning)."""


def stage_specs(graph: LayerGraph, layer_indices: Sequence[int]) -> tuple[TensorSpec, TensorSpec]:
    """Per-sample specs of the tensors entering and leaving a stage of consecutive layers (of a DAG
    model run by a chain plan: everything crossing the cut, packed, :mod:`pipetrain.graph.dataflow`)."""
    inputs, outputs = chain_ports(graph, layer_indices)
    made = graph.output_specs()  # one meta pass for both ports
    return port_spec(graph, inputs[0], made), port_spec(graph, outputs[0], made)


def build_stage_module(graph: LayerGraph, plan: Plan, stage: int, device: torch.device) -> nn.Module:
    """The stage's layers with their initial weights: ``nn.Sequential`` for a chain model, else a
    :class:`~pipetrain.graph.dataflow.StageModule` between the stage's ports (a chain plan's cuts, or
    a DAG of stages' ports toward each neighbouring stage)."""
    indices = [graph.index(name) for name in plan.stages[stage].layers]
    if plan.spec.graph is StageGraph.DAG:
        return StageModule(graph, indices, *dag_ports(graph, plan, stage), device=device)
    return chain_stage(graph, indices, device)


def stage_kernel(graph: LayerGraph, plan: Plan, stage: int, module: nn.Module, device: torch.device,
                 program: Sequence[Action] = (), after: ChainPorts | None = None) -> StageKernel:
    """``stage``'s kernel, chosen from the plan's method record (module docstring).

    Args:
        module: the stage's layers (a split backward records their outputs, weight versions copy them).
        program: the rank's whole program (its W actions split the backward; an asynchronous stage
            counts each weight version's uses in it).
        after: the ports of the stage's predecessor on the same rank (no message between them).
    """
    spec = plan.spec
    if spec.graph is StageGraph.DAG:
        return DagKernel(DagPorts.build(graph, plan, stage), plan.recomputes(stage))
    input_spec, output_spec = stage_specs(graph, [graph.index(name) for name in plan.stages[stage].layers])
    ports = (ChainPorts(input_spec, output_spec, stage == 0) if after is None
             else ChainPorts.after(after, input_spec, output_spec))
    if not spec.gradients_cross_stages:
        return local_kernel(graph, plan, stage, ports, device)
    keeping: Keeping = Recompute() if plan.recomputes(stage) else KeepActivations()
    split = any(a.kind is ActionKind.W for a in program)
    backward: BackwardPass = SplitBackward(module) if split else FusedBackward()
    weights: WeightUse = CurrentWeights(module) if spec.flush else VersionedWeights(WeightVersions(module, program))
    return ChainKernel(ports, keeping, backward, weights)


def build_rank_context(
    graph: LayerGraph,
    plan: Plan,
    rank: int,
    transport: Transport,
    optimizer: OptimizerFactory,
    replicas: dist.ProcessGroup | None = None,
    loss: Loss | None = None,
    program: Sequence[Action] = (),
    stage: int | None = None,
    after: ChainPorts | None = None,
) -> RankContext:
    """Build ``rank``'s stage (its layers with their deterministic initial weights), kernel and state.

    ``replicas`` is the process group of the stage's ranks when the stage is replicated; ``loss``
    the last stage's loss (default: the model's own, ``graph.loss``); ``program`` the rank's whole
    program (:func:`stage_kernel`); ``stage`` which of the rank's stages to build (default its first;
    a multi-stage placement runs several); ``after`` the ports of its predecessor on the same rank.

    Raises:
        UserError: the rank runs no stage of the plan, or a stage with unequal forward and backward
            sizes draws random numbers.
    """
    stage = plan.stage_of_rank(rank) if stage is None else stage
    device = transport.device
    module = build_stage_module(graph, plan, stage, device)
    s = plan.stages[stage]
    if s.forward_sizes != s.backward_sizes:
        _check_deterministic(stage, module)
    kernel = stage_kernel(graph, plan, stage, module, device, program, after)
    params = list(module.parameters()) + (list(kernel.head.parameters()) if kernel.head is not None else [])
    tally = LossTally(model_loss(graph.loss) if loss is None else loss, plan.batch_size,
                      per_microbatch=plan.spec.loss_per_microbatch)
    return RankContext(
        rank=rank,
        stage=stage,
        n_stages=plan.n_stages,
        module=module,
        optimizer=optimizer(params) if params else None,
        transport=transport,
        meter=ActivationMeter(params),
        tally=tally,
        kernel=kernel,
        replicas=replicas,
        input_ranges=_own_ranges(plan, stage, rank) if kernel.ports.reads_input else None,
        precision=StagePrecision(plan.precision, device.type),
    )


def build_rank_contexts(graph: LayerGraph, plan: Plan, rank: int, transport: Transport, optimizer: OptimizerFactory,
                        groups: dict[int, dist.ProcessGroup], loss: Loss, program: Sequence[Action]
                        ) -> dict[int, RankContext]:
    """Every stage ``rank`` runs, by stage (:func:`build_rank_context`; ``groups``: the replicated
    stages' process groups). Two neighbouring stages on the rank (ZB-V's stages ``R − 1`` and ``R``,
    :attr:`~pipetrain.plan.plan.Plan.local_edges`) share the buffers between them instead of messages
    (:class:`~pipetrain.runtime.interp.ports.ChainPorts`)."""
    ctxs: dict[int, RankContext] = {}
    for stage in plan.stages_of_rank(rank):
        before = [a for a, b in plan.local_edges if b == stage and a in ctxs]
        after = ctxs[before[0]].kernel.ports if before else None
        assert after is None or isinstance(after, ChainPorts), "a hand-off on one rank is a chain's (V placement)"
        ctxs[stage] = build_rank_context(graph, plan, rank, transport, optimizer, groups.get(stage), loss, program,
                                         stage, after)
    return ctxs


def _own_ranges(plan: Plan, stage: int, rank: int) -> tuple[Range, ...] | None:
    """The sample ranges of the micro-batches ``rank`` runs on ``stage`` (round-robin replicas); None
    when the stage is not replicated (it runs them all)."""
    if len(plan.stages[stage].ranks) == 1:
        return None
    return tuple(r for j, r in enumerate(ranges(plan.stages[stage].forward_sizes))
                 if plan.replica_rank(stage, j) == rank)


_RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _check_deterministic(stage: int, module: nn.Module) -> None:
    """A stage whose backward ranges differ from its forward ones re-runs forward on other ranges than F
    ran, so its dropout cannot draw F's masks again (:mod:`~pipetrain.runtime.interp.rng_replay`)."""
    random = [name for name, m in module.named_modules() if isinstance(m, _RANDOM_MODULES) and m.p > 0]
    if random:
        raise UserError(
            f"stage {stage} recomputes its forward in backward on other sample ranges than its forward "
            f"ran, but has dropout ({', '.join(random)}), whose re-run would draw new masks; give the stage "
            "equal forward and backward sizes, or set the dropout to 0"
        )


def finish_pending_step(ctx: RankContext) -> None:
    """Finish the optimizer step the stage left pending, if any (``2bw`` with clipping, whose norm's
    all-reduce is in flight: :mod:`~pipetrain.runtime.interp.weights`), so that its weights and
    optimizer state are those after every STEP it ran: before a checkpoint is written, the pipeline
    drained. Every rank has started that all-reduce by then, as every rank ran its STEPs."""
    weights = _versioned_weights(ctx)
    if weights is not None:
        weights.settle()


def reload_versions(ctx: RankContext) -> None:
    """The stage's weights were loaded from a checkpoint: an asynchronous stage's store of weight
    versions holds them as its newest (:meth:`~pipetrain.runtime.interp.versions.WeightVersions.reload`)."""
    weights = _versioned_weights(ctx)
    if weights is not None:
        weights.versions.reload()


def _versioned_weights(ctx: RankContext) -> VersionedWeights | None:
    """The stage's weight versions when it runs an asynchronous method's chain kernel, else None."""
    kernel = ctx.kernel
    if isinstance(kernel, ChainKernel) and isinstance(kernel.weights, VersionedWeights):
        return kernel.weights
    return None


def stage_state_dict(ctx: RankContext, layers: Sequence[Layer], buffers: bool) -> dict[str, torch.Tensor]:
    """The stage's parameters, and with ``buffers`` its buffers (BatchNorm's running statistics), on
    the CPU, keyed by the model's own names (:meth:`Layer.qualified`).

    Args:
        layers: the stage's layers, in the order of ``ctx.module``'s children.
        buffers: include the buffers (the stage's first rank: replica 0's statistics are the ones kept).
    """
    out: dict[str, torch.Tensor] = {}
    for layer, child in zip(layers, ctx.module.children(), strict=True):
        out.update(_on_cpu(child, layer.qualified(""), buffers))
    return out


def head_state_dict(ctx: RankContext, buffers: bool) -> dict[str, torch.Tensor]:
    """The stage's auxiliary-head parameters (and with ``buffers`` its buffers) on the CPU, as
    ``aux{stage}.<name>`` (none without a head)."""
    head = ctx.kernel.head
    return {} if head is None else _on_cpu(head, f"{HEAD_PREFIX}{ctx.stage}.", buffers)


def _on_cpu(module: nn.Module, prefix: str, buffers: bool) -> dict[str, torch.Tensor]:
    """``module``'s ``state_dict`` (parameters only, unless ``buffers``) as CPU copies, each name prefixed."""
    names = {name for name, _ in module.named_parameters()}
    return {f"{prefix}{name}": value.detach().to("cpu", copy=True) for name, value in module.state_dict().items()
            if buffers or name in names}
