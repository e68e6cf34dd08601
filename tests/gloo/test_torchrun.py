"""The torchrun path: ``run_worker_from_env`` under real torchrun, and without a launcher watching.

Without torchrun's agent (as on a second node), a rank whose peer is killed must still stop by
itself, with a :class:`PipelineFailure`, within the timeout: the watchdog and the process group's
timeout see to it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from pipetrain.errors import PipelineFailure
from pipetrain.runtime import FaultInjection, TrainConfig, reference_train, run_worker_from_env

from .models import chain_plan, mlp_graph, rank_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).with_name("torchrun_script.py")
TIMEOUT_S = 5.0


def test_torchrun_matches_reference(tmp_path: Path) -> None:
    out = tmp_path / "result.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), str(out)]
    subprocess.run(cmd, check=True, timeout=100, capture_output=True)
    result = torch.load(out)
    graph = mlp_graph()
    reference = reference_train(graph, 12, TrainConfig(steps=3, progress=False))
    assert result["losses"] == pytest.approx(reference.losses, abs=1e-5)
    for key, value in reference.state_dict.items():
        torch.testing.assert_close(result["state_dict"][key], value, atol=1e-5, rtol=0)


def _env_rank(rank: int, port: int, results: Any) -> None:
    """A rank started as torchrun would start it, but with no agent to stop it."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    graph = mlp_graph()
    config = TrainConfig(steps=4, progress=False, timeout_s=TIMEOUT_S, fault=FaultInjection(1, 1, "kill"))
    start = time.monotonic()
    try:
        run_worker_from_env(graph, chain_plan(graph, 2, 12, 3), config)
        results.put((rank, "finished", time.monotonic() - start))
    except PipelineFailure as e:
        results.put((rank, str(e), time.monotonic() - start))


def test_rank_stops_by_itself_when_peer_dies() -> None:
    with socket.socket() as probe:  # rank 0 hosts the store, as under torchrun without an agent store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    before = set(rank_processes())
    procs = [context.Process(target=_env_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert set(rank_processes()) <= before
    assert procs[1].exitcode == -9
    rank, message, elapsed_s = results.get(timeout=5)
    assert rank == 0
    assert message.startswith("stage 0 (rank 0) stopped at step 1:"), message
    assert "lost stage 1 (rank 1)" in message
    assert elapsed_s < 30
    print(message, f"({elapsed_s:.1f} s)")
