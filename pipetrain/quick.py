"""The short path: a model and its data in, a plan or a trained pipeline out, in one call.

    import pipetrain
    from examples.custom_model import build

    model = build()                                                  # any nn.Module
    result = pipetrain.train(model, "examples.custom_model:digits_data", ranks=2, batch_size=64,
                             epochs=3, lr=0.05, out="run")
    model.load_state_dict(result.state_dict)                         # trained weights and buffers, by name
    print(result.final_eval)

    plan = pipetrain.plan(model, "examples.custom_model:digits_data", ranks=2, batch_size=64)

Each call captures the model (torch.fx, :func:`pipetrain.api.resolve_model`), profiles it here,
plans it for ``ranks`` local ranks (:func:`pipetrain.api.plan`) and, for :func:`train`, trains it on
spawned ranks (:func:`pipetrain.runtime.train.train`). Scripts that call :func:`train` need the
``if __name__ == "__main__":`` guard: the ranks are spawned processes that import the script.
The step-by-step API (:mod:`pipetrain.api`) exposes every stage of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from pipetrain import api
from pipetrain.data import default_source
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.batch_norm import warn_batch_norm
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.plan import Plan
from pipetrain.runtime.job.config import TrainConfig, TrainResult

__all__ = ["plan", "train"]

Model = str | nn.Module | LayerGraph
"""A zoo name, ``module.path:callable``, an ``nn.Module`` or a LayerGraph."""


def plan(
    model: Model,
    data: str | None = None,
    *,
    batch_size: int = 32,
    ranks: int = 2,
    loss: str | None = None,
    planner: str = "balanced",
    optimizer: OptimizerName = "sgd",
    leaf_modules: Sequence[type[nn.Module] | str] = (),
    progress: bool = True,
    clip_grad_norm: bool = False,
) -> Plan:
    """The fastest plan ``planner`` finds for ``model`` on ``ranks`` local ranks, profiled here.

    Args:
        model: what to plan; a user's module is captured with the shapes of ``data``.
        data: ``"digits"``, ``"text"``, ``"synthetic"`` or ``"module.path:callable"`` (needed for
            your own module; default for zoo models: the data they fit).
        batch_size: samples per optimizer step.
        ranks: local ranks (stages, or replicas of them).
        loss: the training loss (default: cross-entropy for class targets, mse for float ones).
        planner: any name of :data:`pipetrain.api.PLANNERS` (``"auto"`` tries them all).
        optimizer: what training will run: its state counts against memory, its step is priced.
        leaf_modules: module classes to keep whole inside one layer when tracing.
        progress: progress bars while profiling and planning.
        clip_grad_norm: whether training will clip the gradient norm (its cost is priced).
    """
    graph = api.resolve_model(model, data=data, loss=loss, leaf_modules=leaf_modules)
    chosen = _plan(graph, batch_size, ranks, loss, planner, optimizer, progress, clip_grad_norm)
    warn_batch_norm(chosen, graph)  # train says it when it runs the plan
    return chosen


def _plan(graph: LayerGraph, batch_size: int, ranks: int, loss: str | None, planner: str,
          optimizer: OptimizerName, progress: bool, clip_grad_norm: bool) -> Plan:
    profile = api.profile_model(graph, batch_size, progress=progress, loss=loss)
    cluster = api.local_cluster(ranks)
    result = api.plan(graph, profile, cluster, batch_size=batch_size, planner=planner,
                      optimizer=optimizer, progress=progress, clip_grad_norm=clip_grad_norm)
    return result.plan


def train(
    model: Model,
    data: str | None = None,
    *,
    plan: Plan | None = None,
    batch_size: int = 32,
    ranks: int = 2,
    loss: str | None = None,
    out: str | Path | None = None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
    **settings: Any,
) -> TrainResult:
    """Train ``model`` on ``data`` with pipeline parallelism on ``ranks`` local ranks.

    Args:
        model, data, batch_size, ranks, loss, leaf_modules: as :func:`plan`.
        plan: a plan to run (e.g. from :func:`plan` or a plan file); default: plan now (balanced).
        out: a folder for ``metrics.csv`` (one row per step), or None.
        settings: any other :class:`~pipetrain.runtime.job.config.TrainConfig` field: ``steps``,
            ``epochs``, ``optimizer``, ``lr``, ``lr_schedule``, ``lr_warmup_steps``, ``lr_rule``,
            ``weight_decay``, ``clip_grad_norm``, ``eval_every``, ``seed``...

    Returns:
        The measured run: ``losses``, ``metrics`` (evaluations included), ``samples_per_s``, the
        measured ``timeline`` and ``state_dict``, the trained weights and buffers (BatchNorm's running
        statistics) under the module's own names: ``model.load_state_dict(result.state_dict)`` loads
        them, strictly.
    """
    from pipetrain.runtime.process.spawn import refuse_rerun_of_main
    from pipetrain.runtime.train import train as run

    refuse_rerun_of_main()  # before capturing and profiling: a script without the __main__ guard
    graph = api.resolve_model(model, data=data, loss=loss, leaf_modules=leaf_modules)
    chosen = plan or _plan(graph, batch_size, ranks, loss, "balanced", settings.get("optimizer", "sgd"),
                           settings.get("progress", True), settings.get("clip_grad_norm") is not None)
    graph = api.graph_for_plan(chosen, graph)
    config = TrainConfig(data=data or default_source(graph), loss=loss, out=Path(out) if out is not None else None,
                         **settings)
    return run(graph, chosen, config, return_state_dict=True)
