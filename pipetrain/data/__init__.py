"""Data: datasets, seeded step-indexed sampling and losses (docs/architecture.md §3).

Sits above ``planners`` and below ``runtime``. Public surface::

    train_batches(source, graph, batch_size, seed) -> BatchSource   # .batch(step) -> (x [B, ...], y [B, ...])
    load_datasets(source, graph) -> DatasetPair(train, eval)        # digits, text, module.path:callable
    eval_batches(dataset, batch_size)                                # the eval set in order
    resolve_loss(name | None, target_spec) -> Loss                   # Loss(output, target) -> sum over samples
    EvalTally().add(loss, output, target); .result() -> EvalResult   # eval loss, accuracy, perplexity
    load_callable("module.path:callable", what)                      # pipetrain.callables: user code, cwd first
    check_source_name(source)                                        # form only; loads nothing
    check_fits(source, graph)                                        # the data against the model, early
    data_specs(source, model) -> (input, target) TensorSpecs         # for a user's nn.Module

Sources: ``digits``, ``text``, ``synthetic`` (:data:`SOURCE_NAMES`) or ``module.path:callable``.
Losses: ``cross-entropy``, ``mse`` (:data:`LOSS_NAMES`) or ``module.path:callable``.
"""

from pipetrain.callables import is_callable_ref, load_callable
from pipetrain.data.evaluation import EvalResult, EvalTally
from pipetrain.data.loader import BatchSource, EpochSampler, StepLoader, epoch_order, eval_batches, gather
from pipetrain.data.loss import LOSS_NAMES, Loss, default_loss_name, model_loss, resolve_loss
from pipetrain.data.pair import DatasetPair, Sample, check_pair, sample_spec
from pipetrain.data.sources import (
    SOURCE_NAMES,
    check_fits,
    check_source_name,
    data_specs,
    default_source,
    load_datasets,
    train_batches,
)
from pipetrain.data.synthetic import SyntheticBatches

__all__ = [
    "LOSS_NAMES",
    "SOURCE_NAMES",
    "BatchSource",
    "DatasetPair",
    "EpochSampler",
    "EvalResult",
    "EvalTally",
    "Loss",
    "Sample",
    "StepLoader",
    "SyntheticBatches",
    "check_fits",
    "check_pair",
    "check_source_name",
    "data_specs",
    "default_loss_name",
    "default_source",
    "epoch_order",
    "eval_batches",
    "gather",
    "is_callable_ref",
    "load_callable",
    "load_datasets",
    "model_loss",
    "resolve_loss",
    "sample_spec",
    "train_batches",
]
