"""Simulated clusters the partitioning and schedule benchmarks share."""

from __future__ import annotations

from pipetrain.cluster import Cluster, Link

__all__ = ["ETHERNET", "NVLINK", "PER_NODE", "v100_servers"]

PER_NODE = 4
NVLINK = Link(5e-6, 150e9)
ETHERNET = Link(2e-5, 25e9 / 8)  # 25 Gbit/s


def v100_servers(n_devices: int) -> Cluster:
    """``n_devices`` V100s, :data:`PER_NODE` per server on NVLink, servers joined by 25 Gbit/s Ethernet."""
    return Cluster.homogeneous("v100", n_devices // PER_NODE, PER_NODE, NVLINK, ETHERNET)
