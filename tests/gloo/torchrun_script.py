"""Run by the torchrun tests: ``torchrun --nproc-per-node 2 torchrun_script.py OUT [kill]``.

Rank 0 writes the result (losses and parameters) to ``OUT`` with ``torch.save``; with ``kill``,
rank 1 is SIGKILLed at step 1 and every rank writes ``OUT.rank{r}`` with how it stopped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from pipetrain.errors import PipelineFailure
from pipetrain.runtime import FaultInjection, TrainConfig, run_worker_from_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gloo.models import chain_plan, mlp_graph


def main(out: str, kill: bool) -> None:
    graph = mlp_graph()
    fault = FaultInjection(rank=1, step=1, kind="kill") if kill else None
    config = TrainConfig(steps=3, progress=False, timeout_s=5.0, fault=fault)
    start = time.monotonic()
    try:
        result = run_worker_from_env(graph, chain_plan(graph, 2, 12, 3), config, return_state_dict=True)
    except PipelineFailure as e:
        rank = int(__import__("os").environ["RANK"])
        Path(f"{out}.rank{rank}").write_text(f"{time.monotonic() - start:.1f}\n{e}")
        raise SystemExit(1) from None
    if result is not None:
        torch.save({"losses": result.losses, "state_dict": result.state_dict}, out)


if __name__ == "__main__":
    main(sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "kill")
