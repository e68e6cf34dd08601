"""A rank's stage, built: its layers with their deterministic initial weights, its optimizer and
the state the interpreter (:mod:`pipetrain.runtime.interp.executor`) runs it with; and the stage's
parameters read back under the model's own names (checkpoints, results).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.data import Loss, model_loss
from pipetrain.errors import UserError
from pipetrain.graph.dataflow import StageModule, chain_ports, chain_stage, port_spec
from pipetrain.graph.layer_graph import Layer, LayerGraph, TensorSpec
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, ranges
from pipetrain.runtime.interp.dag_handlers import DagStage, dag_ports
from pipetrain.runtime.interp.executor import OptimizerFactory, Range, RankContext
from pipetrain.runtime.interp.local_handlers import build_local_stage
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.transport import Transport
from pipetrain.runtime.interp.versions import WeightVersions
from pipetrain.schedule.action import Action

__all__ = ["HEAD_PREFIX", "build_rank_context", "build_stage_module", "head_parameters", "share_local_buffers",
           "stage_parameters", "stage_specs"]

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
    method graph's ports toward each neighbouring stage)."""
    indices = [graph.index(name) for name in plan.stages[stage].layers]
    if plan.method is Method.GRAPH:
        return StageModule(graph, indices, *dag_ports(graph, plan, stage), device=device)
    return chain_stage(graph, indices, device)


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
) -> RankContext:
    """Build ``rank``'s stage (its layers with their deterministic initial weights) and state.

    ``replicas`` is the process group of the stage's ranks when the stage is replicated; ``loss``
    the last stage's loss (default: the model's own, ``graph.loss``); ``program`` the rank's whole
    program, whose weight versions an asynchronous plan's stage keeps (:class:`WeightVersions`);
    ``stage`` which of the rank's stages to build (default its first; method interleaved runs several).

    Raises:
        UserError: the rank runs no stage of the plan.
    """
    stage = plan.stage_of_rank(rank) if stage is None else stage
    indices = [graph.index(name) for name in plan.stages[stage].layers]
    module, recompute = build_stage_module(graph, plan, stage, transport.device), plan.recomputes(stage)
    if recompute:
        _check_deterministic(stage, module)
    dag = DagStage.build(graph, plan, stage) if plan.method is Method.GRAPH else None
    input_spec, output_spec = (graph.input, graph.output_specs()[indices[-1]]) if dag else stage_specs(graph, indices)
    local = build_local_stage(graph, plan, stage, output_spec, transport.device)
    params = list(module.parameters()) + (list(local.head.parameters()) if local and local.head else [])
    return RankContext(
        rank=rank,
        stage=stage,
        n_stages=plan.n_stages,
        module=module,
        optimizer=optimizer(params) if params else None,
        loss=model_loss(graph.loss) if loss is None else loss,
        batch_size=plan.batch_size,
        input_spec=input_spec,
        output_spec=output_spec,
        transport=transport,
        meter=ActivationMeter(params),
        recompute=recompute,
        replicas=replicas,
        input_ranges=_own_ranges(plan, stage, rank) if (dag.reads_input if dag else stage == 0) else None,
        local=local,
        versions=WeightVersions(module, program) if plan.asynchronous else None,
        microbatch_loss=plan.method is Method.PIPEDREAM,
        dag=dag,
    )


def _own_ranges(plan: Plan, stage: int, rank: int) -> tuple[Range, ...] | None:
    """The sample ranges of the micro-batches ``rank`` runs on ``stage`` (round-robin replicas); None
    when the stage is not replicated (it runs them all)."""
    if len(plan.stages[stage].ranks) == 1:
        return None
    return tuple(r for j, r in enumerate(ranges(plan.stages[stage].forward_sizes))
                 if plan.replica_rank(stage, j) == rank)


_RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _check_deterministic(stage: int, module: nn.Module) -> None:
    """A recomputing stage re-runs forward; modules that draw random numbers would draw anew."""
    random = [name for name, m in module.named_modules() if isinstance(m, _RANDOM_MODULES) and m.p > 0]
    if random:
        raise UserError(
            f"stage {stage} recomputes its forward in backward but has dropout ({', '.join(random)}), whose "
            "re-run would draw new masks; give the stage equal forward and backward sizes and leave "
            "the plan's recompute flag off, or set the dropout to 0"
        )


def stage_parameters(ctx: RankContext, layers: Sequence[Layer]) -> dict[str, torch.Tensor]:
    """The stage's parameters on the CPU, keyed by the model's own names (:meth:`Layer.qualified`).

    Args:
        layers: the stage's layers, in the order of ``ctx.module``'s children.
    """
    out: dict[str, torch.Tensor] = {}
    for layer, child in zip(layers, ctx.module.children(), strict=True):
        for pname, p in child.named_parameters():
            out[layer.qualified(pname)] = p.detach().to("cpu", copy=True)
    return out


def head_parameters(ctx: RankContext) -> dict[str, torch.Tensor]:
    """The stage's auxiliary-head parameters on the CPU, as ``aux{stage}.<name>`` (none without a head)."""
    head = ctx.local.head if ctx.local is not None else None
    if head is None:
        return {}
    return {f"{HEAD_PREFIX}{ctx.stage}.{name}": p.detach().to("cpu", copy=True) for name, p in head.named_parameters()}


def share_local_buffers(plan: Plan, ctxs: Mapping[int, RankContext]) -> None:
    """Hand tensors over in memory between neighbouring stages of one rank (ZB-V's stages ``R − 1`` and
    ``R``, :attr:`~pipetrain.plan.plan.Plan.local_edges`), where the schedule has no SEND and RECV:
    the successor's input buffer *is* the predecessor's output buffer (its F puts ``y [b, *out]``
    there, the successor's F takes it as ``x``), and the predecessor's output-gradient buffer is the
    successor's input-gradient buffer (its B puts ``dx``, the predecessor's B takes it as ``dy``)."""
    for a, b in plan.local_edges:
        if a in ctxs and b in ctxs:
            ctxs[b].inputs = ctxs[a].outputs
            ctxs[a].output_grads = ctxs[b].input_grads
