"""Setup the measured benchmarks share: this machine probed as a 2-rank cluster, a logged profile."""

from __future__ import annotations

import time
from dataclasses import asdict

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.profile.link import Workload
from pipetrain.profile.table import Profile

__all__ = ["WARMUP_STEPS", "probe_cluster", "profile_logged"]

WARMUP_STEPS = 2  # untimed steps at the start of every measured run


def probe_cluster(overhead_s: float | None, n_probes: int, model: Workload | None = None,
                  known: Cluster | None = None) -> tuple[Cluster, dict[str, object]]:
    """This machine as a 2-rank cluster (:func:`pipetrain.calibrate.overhead.probe_local_cluster`;
    ``overhead_s`` None: the per-action overhead measured too; ``model``: contention on its work;
    ``known``: an earlier probe's cluster, whose link and all-reduce are kept: only the contention is measured)."""
    from pipetrain.calibrate.overhead import probe_local_cluster

    cluster = probe_local_cluster(2, probes=n_probes, action_overhead_s=overhead_s, model=model,
                                  link=None if known is None else known.intra_node,
                                  collective=None if known is None else known.collective)
    info: dict[str, object] = {
        "latency_s": cluster.intra_node.latency_s,
        "bandwidth_bytes_per_s": cluster.intra_node.bandwidth_bytes_per_s,
        "shared_speed": list(cluster.shared_speed),
        "action_overhead_s": cluster.action_overhead_s,
        "overhead_measured": overhead_s is None,
        "allreduce": None if cluster.collective is None else asdict(cluster.collective),
        "link_measured": known is None,
        "probes": n_probes,
    }
    return cluster, info


def profile_logged(graph: LayerGraph, batch: int, repeats: int = 5) -> Profile:
    """The measured profile of ``graph`` at ``batch`` (``repeats`` timings per layer), printing how long
    profiling took."""
    t0 = time.perf_counter()
    profile = api.profile_model(graph, batch, repeats=repeats)
    print(f"[{graph.name}] profiled in {time.perf_counter() - t0:.1f} s", flush=True)
    return profile
