"""PPLL (method ``local``) simulated on 4 V100s, against sequential local learning and backprop (1F1B).

    .venv/bin/python benchmarks/bench_local_sim.py                          # results in benchmarks/results/local-sim
    .venv/bin/python benchmarks/bench_local_sim.py --batch 1024 --micro 32
    .venv/bin/python benchmarks/bench_local_sim.py --quick                  # dgl heads only, ViT only

Setting (assumptions): 4 V100s in one server, NVLink 2 between them (45 GB/s, 10 µs; the V100 device
model and links of :func:`pipetrain.api.estimated_cluster`). Profiles and heads are *estimated*
(:mod:`pipetrain.profile.estimate`, :mod:`pipetrain.profile.heads`): per-kernel roofline on the meta
device, no GPU runs. Models of the paper's kind (its exact models are not published):

* ``resnet``: zoo ``resnet50-32`` (ResNet-50 on 32×32 CIFAR-sized images, width 1/4, 10 classes);
* ``vit``: zoo ``vit-digits`` scaled to a small ViT on 32×32 images: patch 4 (64 tokens), width 384,
  6 heads, 8 blocks (ViT-S-like width, 1 input channel).

Each runs ``--batch`` samples in ``--micro`` equal micro-batches (default 256 in 8 of 32), for each
auxiliary head kind (``linear``, ``dgl``, ``infopro``), under four cost settings, each adding what a
run pays to the one before (:mod:`common.local_sim_model`):

* ``ideal``: the runtime's 64-wide heads' time; messages cost their ranks nothing;
* ``runtime``: each message also costs its sender and its receiver the runtime's measured host seconds
  for a small message (message-cpu's smallest row, sender and receiver CPU, from ``--message-cpu``;
  on GPUs with NCCL the bytes move on the devices, so no per-byte host cost), the bounded queue's
  hand-off included; the heads' saved activations count in memory;
* ``paper heads``: the heads 128 wide, the feature width of PPLL's authors' group's heads (PAPERS.md §5.2);
* ``host queues``: messages staged through host memory, as gloo on GPUs (the runtime's ``host_staged``)
  or a process queue does: per byte, message-cpu's fitted CPU seconds plus a copy over PCIe 3
  (12 GB/s) on each side.

Per setting, four ways to train:

* ``local``: :func:`~pipetrain.planners.local.build_local_plan` (stages balanced with their heads'
  time); its steady state on a stream of batches (:func:`~pipetrain.simulate.steady.steady_state`,
  PPLL's regime) and its one-batch iteration (fill and drain included, as pipetrain's runtime runs a batch);
* ``local, equal layer counts``: the same, stages cut into equal layer counts, steady state;
* ``sequential``: local learning on one device, the same updates one stage after another: per
  micro-batch the sum over stages of F + B + head + STEP (no messages);
* ``1f1b``: the backprop pipeline on the *same stages* (heads dropped, one step per batch), and on
  its own balanced stages (:func:`~pipetrain.planners.balanced.build_balanced_plan`), messages priced alike.

Speeds are samples/s; ``vs sequential`` is PPLL's "+x %" and ``vs 1f1b`` its "×" (paper: ViT +162 %,
1.25×; ResNet +33 %, 0.85×).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.local_messages import newest_message_record
from common.local_sim_model import N_DEVICES, cost_settings, measure
from common.local_sim_report import report
from harness import Context, Experiment, Row, main

from pipetrain import api
from pipetrain.graph.zoo import build_model
from pipetrain.profile.estimate import estimate_profile

MODELS: dict[str, tuple[str, dict[str, int | float]]] = {
    "resnet": ("resnet50-32", {}),
    "vit": ("vit-digits", {"image": 32, "patch": 4, "width": 384, "heads": 6, "blocks": 8}),
}
AUX = ("linear", "dgl", "infopro")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=256, help="samples per batch (default: 256)")
    p.add_argument("--micro", type=int, default=8, help="micro-batches per batch (default: 8)")
    p.add_argument("--message-cpu", type=Path, default=None,
                   help="a message-cpu record (default: the newest full one in benchmarks/results/message-cpu)")


def settings(ctx: Context) -> list[tuple[str, str]]:
    return [("vit", "dgl")] if ctx.quick else [(m, aux) for m in MODELS for aux in AUX]


def run(case: tuple[str, str], ctx: Context) -> list[Row]:
    name, aux = case
    zoo, overrides = MODELS[name]
    graph = build_model(zoo, **overrides)
    profile = estimate_profile(graph, "v100", ctx.args.batch)
    cluster, _ = api.estimated_cluster("v100", N_DEVICES)
    rows = []
    for setting in cost_settings(ctx.args.message_cpu or newest_message_record()):
        rows.append({"model": name, **measure(graph, profile, cluster, aux, setting, ctx.args.batch, ctx.args.micro)})
        ctx.log(f"{name} {aux} {setting.name}: local {rows[-1]['local_stream']:,.0f} samples/s, "
                f"{rows[-1]['vs_sequential_pct']:+.0f} % over sequential, {rows[-1]['vs_backprop']:.2f}× 1f1b")
    return rows


EXPERIMENT = Experiment(name="local-sim", title="PPLL (local learning) simulated on 4 V100s against the paper's "
                        "figures", settings=settings, run=run, report=report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
