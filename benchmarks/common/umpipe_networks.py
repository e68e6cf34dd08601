"""The networks and simulated clusters of UMPIPE's benchmarks (BENCHMARKS.md "UMPIPE (a)").

gpt1-14, vgg16 and ten synthetic networks at batch :data:`BATCH`, one stage per device, on 4 and 8
V100s or H100s. The links are assumptions: NVLink inside a 4-device node, InfiniBand between nodes.
The synthetic networks have 8 layers (1 or 2 per stage, so stages keep their layers' different cost
curves; with 16 layers over 4 stages every stage mixes all three kinds and the curves look alike)
at width 8: at the default width every stage is launch-bound at batch 64 on these devices, the best
plan of every method is a single micro-batch, and there is nothing to plan.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.cluster import Cluster, Link
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model

__all__ = ["BATCH", "CLUSTERS", "N_SYNTHETIC", "V100_CLUSTERS", "build", "cluster_of", "family", "networks"]

# (device model, nodes, devices per node, link inside a node, link between nodes): assumptions.
CLUSTERS: dict[str, tuple[str, int, int, Link, Link]] = {
    "4xV100": ("v100", 1, 4, Link(1e-5, 4.5e10), Link(5e-6, 1.25e10)),  # NVLink 2; IB EDR 100 Gb/s
    "8xV100": ("v100", 2, 4, Link(1e-5, 4.5e10), Link(5e-6, 1.25e10)),
    "4xH100": ("h100", 1, 4, Link(8e-6, 3.0e11), Link(5e-6, 5.0e10)),  # NVLink 4; IB NDR 400 Gb/s
    "8xH100": ("h100", 2, 4, Link(8e-6, 3.0e11), Link(5e-6, 5.0e10)),
}
V100_CLUSTERS = ("4xV100", "8xV100")  # the clusters of the V100-only benchmarks (zb1-ga, interleaved-ga)
N_SYNTHETIC = 10
BATCH = 64


def networks(quick: bool) -> list[str]:
    """gpt1-14, vgg16 and the synthetic networks; with ``quick``, gpt1-14 and synthetic-0."""
    if quick:
        return ["gpt1-14", "synthetic-0"]
    return ["gpt1-14", "vgg16", *(f"synthetic-{k}" for k in range(N_SYNTHETIC))]


def family(network: str) -> str:
    """``"synthetic"`` for every synthetic network, else the network itself."""
    return "synthetic" if network.startswith("synthetic") else network


def build(network: str) -> LayerGraph:
    """A zoo model; ``synthetic-<k>`` is variant ``k`` with 8 layers at width 8 (module docstring)."""
    if network.startswith("synthetic-"):
        return build_model("synthetic", variant=int(network.rsplit("-", 1)[1]), n_layers=8, width=8.0)
    return build_model(network)


def cluster_of(name: str) -> Cluster:
    """The simulated cluster ``name``, a key of :data:`CLUSTERS`."""
    device, nodes, per_node, intra, inter = CLUSTERS[name]
    return replace(Cluster.homogeneous(device, nodes, per_node, intra, inter), name=name)
