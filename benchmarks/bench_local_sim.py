"""PPLL (method ``local``) simulated on 4 V100s, against sequential local learning and backprop (1F1B).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_local_sim.py --out benchmarks/results/local-sim

Setting (assumptions): 4 V100s in one server, NVLink 2 between them (45 GB/s, 10 µs; the V100 device
model and links of :func:`pipetrain.api.estimated_cluster`). Profiles and heads are *estimated*
(:mod:`pipetrain.profile.estimate`, :mod:`pipetrain.profile.heads`): per-kernel roofline on the meta
device, no GPU runs. Models of the paper's kind (its exact models are not published):

* ``resnet``: zoo ``resnet50-32`` (ResNet-50 on 32×32 CIFAR-sized images, width 1/4, 10 classes);
* ``vit``: zoo ``vit-digits`` scaled to a small ViT on 32×32 images: patch 4 (64 tokens), width 384,
  6 heads, 8 blocks (ViT-S-like width, 1 input channel).

Each runs ``--batch`` samples in ``--micro`` equal micro-batches (default 256 in 8 of 32), for each
auxiliary head kind (``linear``, ``dgl``, ``infopro``; ``--quick``: ``dgl`` alone), under four cost
settings, each adding what a run pays to the one before (:class:`Setting`):

* ``ideal``: the runtime's 64-wide heads' time; messages cost their ranks nothing;
* ``runtime``: each message also costs its sender and its receiver the runtime's measured host seconds
  for a small message (``--message-cpu``: :mod:`bench_message_cpu`'s 4 KiB row, sender and receiver
  CPU; on GPUs with NCCL the bytes move on the devices, so no per-byte host cost), the bounded queue's
  hand-off included; the heads' saved activations count in memory;
* ``paper heads``: the heads 128 wide, the feature width of PPLL's authors' group's heads (PAPERS.md §5.2);
* ``host queues``: messages staged through host memory, as gloo on GPUs (the runtime's ``host_staged``)
  or a process queue does: per byte, the fitted CPU seconds of ``--message-cpu`` plus a copy over
  PCIe 3 (``PCIE_BYTES_PER_S``) on each side.

Per setting, four ways to train:

* ``local``: :func:`~pipetrain.planners.local.build_local_plan` (stages balanced with their heads'
  time); its steady state on a stream of batches (:func:`~pipetrain.simulate.steady.steady_state`,
  PPLL's regime) and its one-batch iteration (fill and drain included, as pipetrain's runtime runs a batch);
* ``local, equal layer counts``: the same, stages cut into equal layer counts, steady state;
* ``sequential``: local learning on one device, the same updates one stage after another: per
  micro-batch the sum over stages of F + B + head + STEP (:func:`sequential_batch_s`; no messages);
* ``1f1b``: the backprop pipeline on the *same stages* (heads dropped, one step per batch), and on
  its own balanced stages (:func:`~pipetrain.planners.balanced.build_balanced_plan`), messages priced alike.

Speeds are samples/s; ``vs sequential`` is PPLL's "+x %" and ``vs 1f1b`` its "×" (paper: ViT +162 %,
1.25×; ResNet +33 %, 0.85×). Output under ``--out``: ``local_sim.json`` and ``local_sim.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel, MessageHost
from pipetrain.fileio import write_atomic
from pipetrain.graph.aux_heads import AUX_WIDTH
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method, MethodParams, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.planners.local import build_local_plan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks
from pipetrain.simulate.steady import steady_state

MODELS: dict[str, tuple[str, dict[str, int | float]]] = {
    "resnet": ("resnet50-32", {}),
    "vit": ("vit-digits", {"image": 32, "patch": 4, "width": 384, "heads": 6, "blocks": 8}),
}
AUX = ("linear", "dgl", "infopro")
PAPER = {"resnet": (33.0, 0.85), "vit": (162.0, 1.25)}  # +% over sequential local learning, × backprop pipeline
N_DEVICES = 4
PAPER_WIDTH = 128  # the feature width of the authors' group's heads (PAPERS.md §5.2: HPFF, InfoPro, DGL-style)
PCIE_BYTES_PER_S = 12e9  # a V100 SXM2's PCIe 3 x16 host link (15.75 GB/s peak), one copy each side
MiB = 1 << 20


@dataclass(frozen=True)
class Setting:
    """What a run pays beside its layers (module docstring): the heads' width and each message's host seconds."""

    name: str
    width: int
    host: MessageHost


def settings(message_cpu: Path) -> tuple[Setting, ...]:
    """The four settings, their host seconds from ``bench_message_cpu``'s results (module docstring)."""
    data = json.loads(message_cpu.read_text())
    small = min(data["rows"], key=lambda r: r["bytes"])
    runtime = MessageHost(send_s=small["send_cpu_s"], recv_s=small["recv_cpu_s"])
    copy = 1 / PCIE_BYTES_PER_S
    staged = replace(runtime, send_per_byte_s=data["fits"]["sender"][1] + copy,
                     recv_per_byte_s=data["fits"]["receiver"][1] + copy)
    return (Setting("ideal", AUX_WIDTH, MessageHost()), Setting("runtime", AUX_WIDTH, runtime),
            Setting("paper heads", PAPER_WIDTH, runtime), Setting("host queues", PAPER_WIDTH, staged))


@dataclass(frozen=True)
class Row:
    """One model, head kind and setting: samples/s of each way to train, the local plan's stages (ms per
    micro-batch: the stage's forward + backward, its head's forward + backward, both steps, its
    messages' host seconds) and the largest stage's activation peak (MiB) under local and 1F1B."""

    model: str
    zoo: str
    aux: str
    setting: str
    stages: list[int]
    stage_ms: list[float]
    head_ms: list[float]
    step_ms: list[float]
    message_ms: list[float]
    local_stream: float
    local_batch: float
    local_equal_split: float
    sequential: float
    backprop_same: float
    backprop_balanced: float
    backprop_stages: list[int]
    local_peak_mib: float
    backprop_peak_mib: float

    @property
    def vs_sequential_pct(self) -> float:
        return (self.local_stream / self.sequential - 1) * 100

    @property
    def vs_backprop(self) -> float:
        return self.local_stream / self.backprop_same


def stage_parts_s(plan: Plan, cost: CostModel) -> list[tuple[float, float, float, float]]:
    """Per stage of ``plan``, seconds per micro-batch of (F + B, head F + B, stage + head STEP, the host
    seconds of its receive and send)."""
    parts = []
    for k, stage in enumerate(plan.stages):
        b, layers = stage.forward_sizes[0], stage.layers
        own = cost.forward_s(layers, b, k) + cost.backward_s(layers, b, k)
        head = cost.head_forward_s(layers, b, k) + cost.head_backward_s(layers, b, k)
        messages = ((cost.recv_host_s(cost.input_bytes(layers, b)) if k > 0 else 0.0)
                    + (cost.send_host_s(cost.output_bytes(layers, b)) if k < plan.n_stages - 1 else 0.0))
        parts.append((own, head, cost.step_s(layers, k) + cost.head_step_s(layers, k), messages))
    return parts


def equal_split(plan: Plan) -> Plan:
    """``plan`` with (nearly) equal layer *counts* per stage, earlier stages taking the extra layers:
    one block per GPU, as a split that ignores costs would cut it."""
    names = [n for s in plan.stages for n in s.layers]
    size, extra = divmod(len(names), plan.n_stages)
    stages, first = [], 0
    for k, stage in enumerate(plan.stages):
        count = size + (k < extra)
        stages.append(replace(stage, layers=tuple(names[first:first + count])))
        first += count
    return replace(plan, stages=tuple(stages), prediction=None)


def sequential_batch_s(plan: Plan, cost: CostModel) -> float:
    """Local learning on one device: every micro-batch through every stage in turn, no overlap, no messages."""
    per_micro = sum(sum(p[:3]) for p in stage_parts_s(plan, cost))
    return per_micro * len(plan.stages[0].forward_sizes)


def backprop(plan: Plan, graph: LayerGraph, plain: CostModel) -> tuple[float, float, list[int], float]:
    """1F1B samples/s on the local plan's stages, on its own balanced stages, those stages' layer
    counts, and the largest activation peak (MiB) on the local plan's stages."""
    same = replace(plan, method=Method.ONE_F_ONE_B, weights=WeightPolicy.SYNC, params=MethodParams(), prediction=None)
    own = build_balanced_plan(ModelRef.of(graph), plain, method=Method.ONE_F_ONE_B, n_stages=plan.n_stages,
                              batch_size=plan.batch_size, n_micro=len(plan.stages[0].forward_sizes))
    same_s, own_s = (simulate(build_schedule(p), p, plain).iteration_s for p in (same, own))
    peak = max(activation_peaks(same, plain)) / MiB
    return plan.batch_size / same_s, plan.batch_size / own_s, [len(s.layers) for s in own.stages], peak


def measure(name: str, aux: str, setting: Setting, graph: LayerGraph, profile: Profile, cluster: Cluster,
            args: argparse.Namespace) -> Row:
    """Plan, simulate and compare one model with one head kind under one setting (module docstring)."""
    cost = api.local_cost(graph, profile, cluster, aux, width=setting.width).with_message_host(setting.host)
    plain = CostModel(profile, cluster).with_message_host(setting.host)
    plan = build_local_plan(ModelRef.of(graph), cost, aux=aux, queue_depth=api.local_params(graph, aux).queue_depth,
                            n_stages=N_DEVICES, batch_size=args.batch, n_micro=args.micro)
    parts = stage_parts_s(plan, cost)
    stream = steady_state(plan, cost).samples_per_s
    batch = args.batch / simulate(build_schedule(plan), plan, cost).iteration_s
    equal = steady_state(equal_split(plan), cost).samples_per_s
    same, balanced, own_stages, backprop_peak = backprop(plan, graph, plain)
    stage_ms, head_ms, step_ms, message_ms = ([p[i] * 1e3 for p in parts] for i in range(4))
    return Row(name, graph.name, aux, setting.name, [len(s.layers) for s in plan.stages], stage_ms, head_ms, step_ms,
               message_ms, stream, batch, equal,
               args.batch / sequential_batch_s(plan, cost), same, balanced, own_stages,
               max(activation_peaks(plan, cost)) / MiB, backprop_peak)


def _ms(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def report(rows: list[Row], args: argparse.Namespace, described: str) -> str:
    """The markdown tables of ``local_sim.md``."""
    lines = [
        "# PPLL (method local) simulated on 4 V100s", "",
        f"Batch {args.batch} in {args.micro} micro-batches of {args.batch // args.micro}; estimated profiles "
        f"(roofline, V100 model); NVLink 2 between the 4 devices. Host: {platform.machine()}, torch "
        f"{torch.__version__} (only for tracing). Paper: ResNet +33 % over sequential local learning and 0.85× "
        "the backprop pipeline; ViT +162 % and 1.25×.", "", f"Settings: {described}", "",
        "| model | aux | setting | stages (layers) | local stream samples/s | local one batch | local, equal layer "
        "counts | sequential local | 1f1b same stages | 1f1b own stages | local vs sequential | local vs 1f1b (same) "
        "| peak activations MiB: local, 1f1b | paper |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pct, times = PAPER[r.model]
        lines.append(f"| {r.model} ({r.zoo}) | {r.aux} | {r.setting} | {'/'.join(map(str, r.stages))} | "
                     f"{r.local_stream:,.0f} | {r.local_batch:,.0f} | {r.local_equal_split:,.0f} | "
                     f"{r.sequential:,.0f} | "
                     f"{r.backprop_same:,.0f} | {r.backprop_balanced:,.0f} ({'/'.join(map(str, r.backprop_stages))}) | "
                     f"{r.vs_sequential_pct:+.0f} % | {r.vs_backprop:.2f}× | {r.local_peak_mib:.1f}, "
                     f"{r.backprop_peak_mib:.1f} | {pct:+.0f} %, {times:.2f}× |")
    lines += ["", "Per stage, ms per micro-batch: stage F + B | head F + B | steps (stage and head) | messages' host "
              "seconds", "", "| model | aux | setting | stage F+B | head F+B | steps | messages |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {r.aux} | {r.setting} | {_ms(r.stage_ms)} | {_ms(r.head_ms)} | {_ms(r.step_ms)} | "
              f"{_ms(r.message_ms)} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="samples per batch (default: 256)")
    parser.add_argument("--micro", type=int, default=8, help="micro-batches per batch (default: 8)")
    parser.add_argument("--message-cpu", type=Path, default=Path("benchmarks/results/message-cpu/message_cpu.json"),
                        help="bench_message_cpu's results: the runtime's host seconds per message")
    parser.add_argument("--quick", action="store_true", help="dgl heads only")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/local-sim"), help="output folder")
    args = parser.parse_args(argv)
    cluster, _ = api.estimated_cluster("v100", N_DEVICES)
    chosen = settings(args.message_cpu)
    described = "; ".join(f"{s.name}: heads {s.width} wide, per message send {s.host.send_s * 1e6:.1f} µs + "
                          f"{s.host.send_per_byte_s * 1e9:.3f} ns/B, receive {s.host.recv_s * 1e6:.1f} µs + "
                          f"{s.host.recv_per_byte_s * 1e9:.3f} ns/B" for s in chosen)
    rows = []
    for name, (zoo, overrides) in MODELS.items():
        graph = build_model(zoo, **overrides)
        profile = estimate_profile(graph, "v100", args.batch)
        for aux in ("dgl",) if args.quick else AUX:
            rows += [measure(name, aux, s, graph, profile, cluster, args) for s in chosen]
    text = report(rows, args, described)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    data = [{**asdict(r), "vs_sequential_pct": r.vs_sequential_pct, "vs_backprop": r.vs_backprop} for r in rows]
    write_atomic(args.out / "local_sim.json", json.dumps(data, indent=1))
    write_atomic(args.out / "local_sim.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
