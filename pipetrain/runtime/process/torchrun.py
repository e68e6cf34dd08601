"""Running one rank of a torchrun launch (``torchrun --nproc-per-node 2 -m pipetrain train ...``).

:func:`run_worker_from_env` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` and runs the same worker as a locally spawned rank (:mod:`pipetrain.runtime.process.worker`);
rank 0 returns the result. On CUDA, rank ``LOCAL_RANK`` computes on ``cuda:(LOCAL_RANK mod GPUs)``, and
the ``LOCAL_WORLD_SIZE`` ranks of a machine must each have a GPU of their own under NCCL
(:mod:`pipetrain.device_select`). The rank hosts the rendezvous store itself unless torchrun's agent does
(``TORCHELASTIC_USE_AGENT_STORE``), and each torchrun restart gets a fresh key prefix. Reports go to
the log, which torchrun collects per rank; the watchdog makes the ranks stop when a peer dies.
"""

from __future__ import annotations

import logging
import os

from pipetrain.device_select import check_placement
from pipetrain.errors import PipelineFailure, UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.batch_norm import warn_batch_norm
from pipetrain.plan.plan import Plan
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.config import StepMetrics, TrainConfig, TrainJob, TrainResult
from pipetrain.runtime.process.worker import RankFailure, Rendezvous, run_session
from pipetrain.schedule.schedule import Schedule

__all__ = ["run_worker_from_env"]

logger = logging.getLogger(__name__)


class _LogReporter:
    """A torchrun rank's reports go to the log (torchrun collects each rank's output)."""

    def started(self, rank: int, job: int) -> None:
        logger.debug("rank %d: job %d started", rank, job)

    def progress(self, job: int, row: StepMetrics) -> None:
        evaluation = f", eval loss {row.eval_loss:.4f}" if row.eval_loss is not None else ""
        logger.info("step %d: loss %.4f%s, %.3f s", row.step, row.loss, evaluation, row.step_s)

    def failed(self, rank: int, message: str, secondary: bool, details: str) -> None:
        logger.error("%s", message)

    def flush(self) -> None:
        pass


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise UserError(f"environment variable {name} is missing or not an integer; start with torchrun") from None


def _check_gpu(config: TrainConfig, local_rank: int) -> None:
    """This machine's ranks (``LOCAL_WORLD_SIZE``, else this rank's count) fit its GPUs
    (:func:`~pipetrain.device_select.check_placement`)."""
    ranks_per_node = _env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else local_rank + 1
    check_placement(config.resolved_device(), config.resolved_backend(), max(ranks_per_node, local_rank + 1))


def run_worker_from_env(
    graph: LayerGraph, plan: Plan, config: TrainConfig, *, schedule: Schedule | None = None,
    return_state_dict: bool = False,
) -> TrainResult | None:
    """Run this process's rank of a torchrun launch; rank 0 returns the result, others None.

    ``schedule``: what the ranks execute (every rank must load the same one); default the plan's own.

    Raises:
        UserError: the torchrun variables are missing, or the world size does not match the plan.
        PipelineFailure: this rank failed, or stopped because a peer failed (named if known).
    """
    rank, world_size, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if world_size != plan.n_ranks:
        raise UserError(f"torchrun started {world_size} ranks but the plan uses {plan.n_ranks}; "
                        f"use --nproc-per-node/--nnodes to start {plan.n_ranks}")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    rdv = Rendezvous(
        host=os.environ.get("MASTER_ADDR", "127.0.0.1"), port=_env_int("MASTER_PORT"), rank=rank,
        world_size=world_size, local_rank=local_rank, store_is_master=rank == 0 and not agent_store,
        prefix=f"pipetrain/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
    )
    _check_gpu(config, local_rank)
    job = check_job(TrainJob(graph, plan, config, return_state_dict, schedule))
    if rank == 0:
        warn_batch_norm(plan, graph)
    try:
        results = run_session(rdv, [job], _LogReporter())
    except RankFailure as e:
        raise PipelineFailure(e.message) from e
    return results[0] if results else None
