"""local-sim's simulation: PPLL's plan on 4 V100s against sequential local learning and 1F1B, per cost setting.

A :class:`Setting` is what a run pays beside its layers: the auxiliary heads' width and each
message's host seconds (:mod:`common.local_messages`); :func:`measure` plans, simulates and compares
one model with one head kind under one setting. local-sim's docstring says what each figure is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel, MessageHost
from pipetrain.graph.aux_heads import AUX_WIDTH
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method, MethodParams, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.local import build_local_plan
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks
from pipetrain.simulate.steady import steady_state

from .local_messages import message_host

__all__ = ["N_DEVICES", "Setting", "cost_settings", "measure"]

N_DEVICES = 4
PAPER_WIDTH = 128  # the feature width of the authors' group's heads (PAPERS.md §5.2: HPFF, InfoPro, DGL-style)
PCIE_BYTES_PER_S = 12e9  # a V100 SXM2's PCIe 3 x16 host link (15.75 GB/s peak), one copy each side
MiB = 1 << 20


@dataclass(frozen=True)
class Setting:
    """What a run pays beside its layers: the heads' width and each message's host seconds."""

    name: str
    width: int
    host: MessageHost


def cost_settings(message_cpu: Path) -> tuple[Setting, ...]:
    """``ideal``, ``runtime``, ``paper heads`` and ``host queues``, priced by the message-cpu record."""
    runtime, staged = message_host(message_cpu, per_byte_extra_s=1 / PCIE_BYTES_PER_S)
    return (Setting("ideal", AUX_WIDTH, MessageHost()), Setting("runtime", AUX_WIDTH, runtime),
            Setting("paper heads", PAPER_WIDTH, runtime), Setting("host queues", PAPER_WIDTH, staged))


def _stage_parts_s(plan: Plan, cost: CostModel) -> list[tuple[float, float, float, float]]:
    """Per stage, seconds per micro-batch of (F + B, head F + B, stage + head STEP, its messages' host seconds)."""
    parts = []
    for k, stage in enumerate(plan.stages):
        b, layers = stage.forward_sizes[0], stage.layers
        own = cost.forward_s(layers, b, k) + cost.backward_s(layers, b, k)
        head = cost.head_forward_s(layers, b, k) + cost.head_backward_s(layers, b, k)
        messages = ((cost.recv_host_s(cost.input_bytes(layers, b)) if k > 0 else 0.0)
                    + (cost.send_host_s(cost.output_bytes(layers, b)) if k < plan.n_stages - 1 else 0.0))
        parts.append((own, head, cost.step_s(layers, k) + cost.head_step_s(layers, k), messages))
    return parts


def _equal_split(plan: Plan) -> Plan:
    """``plan`` with (nearly) equal layer *counts* per stage, earlier stages taking the extra layers."""
    names = [n for s in plan.stages for n in s.layers]
    size, extra = divmod(len(names), plan.n_stages)
    stages, first = [], 0
    for k, stage in enumerate(plan.stages):
        count = size + (k < extra)
        stages.append(replace(stage, layers=tuple(names[first:first + count])))
        first += count
    return replace(plan, stages=tuple(stages), prediction=None)


def _backprop(plan: Plan, graph: LayerGraph, plain: CostModel) -> tuple[float, float, list[int], float]:
    """1F1B samples/s on the local plan's stages, on its own balanced stages, those stages' layer
    counts, and the largest activation peak (MiB) on the local plan's stages."""
    same = replace(plan, method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams(), prediction=None)
    own = build_balanced_plan(ModelRef.of(graph), plain, method=Method.ONE_F_ONE_B, n_stages=plan.n_stages,
                              batch_size=plan.batch_size, n_micro=len(plan.stages[0].forward_sizes))
    same_s, own_s = (simulate(build_schedule(p), p, plain).iteration_s for p in (same, own))
    peak = max(activation_peaks(same, plain)) / MiB
    return plan.batch_size / same_s, plan.batch_size / own_s, [len(s.layers) for s in own.stages], peak


def measure(graph: LayerGraph, profile: Profile, cluster: Cluster, aux: str, setting: Setting, batch: int,
            micro: int) -> dict[str, object]:
    """Plan, simulate and compare ``graph`` with ``aux`` heads under ``setting``: one row."""
    cost = api.local_cost(graph, profile, cluster, aux, width=setting.width).with_message_host(setting.host)
    plain = CostModel(profile, cluster).with_message_host(setting.host)
    plan = build_local_plan(ModelRef.of(graph), cost, aux=aux, queue_depth=api.local_params(graph, aux).queue_depth,
                            n_stages=N_DEVICES, batch_size=batch, n_micro=micro)
    parts = _stage_parts_s(plan, cost)
    same, balanced, own_stages, backprop_peak = _backprop(plan, graph, plain)
    sequential = batch / (sum(sum(p[:3]) for p in parts) * micro)  # one device, stage after stage, no messages
    stream = steady_state(plan, cost).samples_per_s
    return {"zoo": graph.name, "aux": aux, "setting": setting.name, "width": setting.width,
            "host": {"send_s": setting.host.send_s, "recv_s": setting.host.recv_s,
                     "send_per_byte_s": setting.host.send_per_byte_s, "recv_per_byte_s": setting.host.recv_per_byte_s},
            "stages": [len(s.layers) for s in plan.stages],
            **{key: [p[i] * 1e3 for p in parts] for i, key in enumerate(("stage_ms", "head_ms", "step_ms",
                                                                          "message_ms"))},
            "local_stream": stream, "local_batch": batch / simulate(build_schedule(plan), plan, cost).iteration_s,
            "local_equal_split": steady_state(_equal_split(plan), cost).samples_per_s, "sequential": sequential,
            "backprop_same": same, "backprop_balanced": balanced, "backprop_stages": own_stages,
            "local_peak_mib": max(activation_peaks(plan, cost)) / MiB, "backprop_peak_mib": backprop_peak,
            "vs_sequential_pct": (stream / sequential - 1) * 100, "vs_backprop": stream / same}
