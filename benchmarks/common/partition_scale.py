"""One point of plan-scale: plan zoo ``gpt1-14`` with a number of blocks at batch :data:`BATCH` on
``devices`` A100s in servers of 8 with one planner, in a fresh process (so that no cache of an
earlier point helps) under a time limit; the planning call's CPU and wall seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["BATCH", "measure", "one"]

BATCH = 512


def one(planner: str, devices: int, blocks: int) -> dict[str, Any]:
    """Plan once in this process; the plan's summary and the seconds it took."""
    from pipetrain import api
    from pipetrain.cluster import Cluster, Link
    from pipetrain.graph.zoo import build_model

    graph = build_model("gpt1-14", blocks=blocks)
    cluster = Cluster.homogeneous("a100", max(1, devices // 8), min(devices, 8), Link(5e-6, 300e9), Link(5e-6, 25e9))
    profiles = api.cluster_profiles(graph, cluster, BATCH)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = api.plan(graph, profiles, cluster, batch_size=BATCH, planner=planner).plan
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert plan.prediction is not None
    return {"cpu_s": cpu, "wall_s": wall, "method": plan.method.value, "micro": len(plan.stages[0].forward_sizes),
            "stages": "/".join(s.label for s in plan.stages), "iteration_s": plan.prediction.iteration_s}


def measure(planner: str, devices: int, blocks: int, limit: float) -> dict[str, Any]:
    """:func:`one` in a fresh process, or ``{"skipped": why}`` past ``limit`` seconds or on an error."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
            f"from common.partition_scale import one; print(json.dumps(one({planner!r}, {devices}, {blocks})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over {limit:.0f} s"}
    except subprocess.CalledProcessError as e:
        return {"skipped": e.stderr.strip().splitlines()[-1][:200]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
