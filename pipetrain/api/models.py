"""The model a plan is for: resolve it (zoo, user module, LayerGraph), profile it, check it against plans.

    graph = api.resolve_model("gpt-tiny")                         # or an nn.Module with data=
    profile = api.profile_model(graph, batch_size=32)             # measured here, or estimate="v100"
    graph = api.graph_for_plan(plan)                              # the model a saved plan was made for
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from pipetrain.callables import is_callable_ref
from pipetrain.data import data_specs, resolve_loss
from pipetrain.device_select import DeviceChoice, resolve_device
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.load import capture_module, default_loss_kind, load_model
from pipetrain.plan.plan import Plan
from pipetrain.plan.stage_graph import validate_for_graph
from pipetrain.planners import ModelRef
from pipetrain.profile.table import Profile

__all__ = ["check_stage_count", "graph_for_plan", "profile_model", "resolve_model"]


def resolve_model(
    model: str | LayerGraph | nn.Module,
    *,
    data: str | None = None,
    loss: str | None = None,
    name: str | None = None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
) -> LayerGraph:
    """The LayerGraph of ``model``: as given, from the zoo, or the user's module captured with torch.fx.

    Args:
        model: a LayerGraph; a zoo name (the other arguments are then ignored); ``module.path:callable``
            returning an ``nn.Module``; or an ``nn.Module``. The last two are captured
            (:func:`~pipetrain.graph.capture.capture`) with the per-sample input and target specs
            of ``data``.
        data: what a user's module trains on: ``"digits"`` or ``"module.path:callable"``.
        loss: the training loss (:func:`~pipetrain.data.resolve_loss`): the graph's ``loss`` is its
            kind, or for a user's callable loss, which the runtime takes separately, the targets' default.
        name: the graph's name for an ``nn.Module`` (default: its class name); a reference is its
            graph's name, so that plans can rebuild it.
        leaf_modules: module classes (or ``module.path:Class``) to keep whole in one layer.

    Raises:
        UserError: an unknown name, no ``data`` (or ``synthetic``/``text``) for a user's module, a
            loss that does not fit the data, a module that cannot be captured.
    """
    if isinstance(model, LayerGraph):
        return model
    if isinstance(model, str) and not is_callable_ref(model):
        return load_model(model, input=None, target=None, loss=None)
    label = model if isinstance(model, str) else name or type(model).__name__
    if data is None:
        raise UserError(f"model {label!r} is your own module, whose input and target shapes come from the data; "
                        "pass data (--data) digits or module.path:callable")
    input, target = data_specs(data, label)
    kind = resolve_loss(loss, target, input).kind or default_loss_kind(target, input)
    if isinstance(model, str):
        return load_model(model, input=input, target=target, loss=kind, leaf_modules=leaf_modules)
    return capture_module(model, input=input, target=target, loss=kind, name=label, leaf_modules=leaf_modules)


def graph_for_plan(
    plan: Plan,
    graph: LayerGraph | None = None,
    *,
    data: str | None = None,
    leaf_modules: Sequence[type[nn.Module] | str] = (),
) -> LayerGraph:
    """The model a plan was made for, checked against the plan (layers and fingerprint): ``graph``,
    else rebuilt from ``plan.model``, a zoo name or ``module.path:callable`` (captured with the
    specs of ``data`` and ``leaf_modules``, as :func:`resolve_model`)."""
    graph = graph or resolve_model(plan.model, data=data, leaf_modules=leaf_modules)
    validate_for_graph(plan, graph)
    return graph


def profile_model(
    graph: LayerGraph,
    batch_size: int,
    *,
    estimate: str | None = None,
    progress: bool = False,
    repeats: int = 5,
    loss: str | None = None,
    device: DeviceChoice = "auto",
) -> Profile:
    """Measure the model's per-layer costs here, or estimate them for a device model.

    Args:
        graph: the model.
        batch_size: the largest micro-batch size of the grid.
        estimate: a device model name (``"v100"``, ``"h100"``...) to estimate instead of measure.
        progress: show a progress bar while measuring.
        repeats: timed repeats per (layer, size); the median is kept.
        loss: the training loss timed on the last layer: ``"cross-entropy"``, ``"mse"``,
            ``"module.path:callable"``, or None for the model's own.
        device: measure on ``"cuda"`` (the current GPU, timed by CUDA events), ``"cpu"``, or ``"auto"``:
            CUDA when torch sees a GPU (:func:`~pipetrain.device_select.resolve_device`).

    Raises:
        UserError: ``device="cuda"`` where torch sees no GPU.
    """
    if estimate is not None:
        from pipetrain.profile.estimate import estimate_profile

        return estimate_profile(graph, estimate, batch_size)
    from pipetrain.data import resolve_loss
    from pipetrain.profile.measure import measure_profile

    loss_fn = None if loss is None else resolve_loss(loss, graph.target)
    return measure_profile(graph, batch_size, repeats=repeats, progress=progress, loss=loss_fn,
                           device=resolve_device(device))


def check_stage_count(model: LayerGraph | ModelRef, n_stages: int) -> None:
    """Fail fast, before any profiling, when the model cannot be cut into ``n_stages``."""
    names = model.names if isinstance(model, LayerGraph) else model.layer_names
    if n_stages > len(names):
        raise UserError(
            f"{n_stages} stages but {model.name!r} has only {len(names)} layers; use at most {len(names)} ranks"
        )
