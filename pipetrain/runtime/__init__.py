"""The runtime: runs a plan's schedule on real ranks and measures it (docs/architecture.md §6).

Public surface::

    train(graph, plan, config) -> TrainResult          # local ranks, one process each
    train_many(jobs) -> list[TrainResult]              # several plans, one launch
    reference_train(graph, batch_size, config)         # unpipelined baseline
    run_worker_from_env(graph, plan, config)           # one rank under torchrun
    HANDLERS                                           # the interpreter's action handlers

Importing it starts nothing and probes no device.
"""

from pipetrain.runtime.interp.executor import HANDLERS
from pipetrain.runtime.job.config import FaultInjection, TrainConfig, TrainJob, TrainResult
from pipetrain.runtime.process.torchrun import run_worker_from_env
from pipetrain.runtime.train import reference_train, train, train_many

__all__ = [
    "HANDLERS",
    "FaultInjection",
    "TrainConfig",
    "TrainJob",
    "TrainResult",
    "reference_train",
    "run_worker_from_env",
    "train",
    "train_many",
]
