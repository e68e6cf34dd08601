"""Auxiliary heads' costs: what method ``local`` adds to a stage, profiled like a layer.

With method ``local`` (PPLL, docs/algorithms.md §6) every stage but the last runs its auxiliary
head (:mod:`pipetrain.graph.aux_heads`) in F (the head's forward and local loss), in B (the head's
backward, down to the gradient of the stage's output) and in STEP (the head's parameters). A head is
built from the per-sample output spec of the layer it follows alone, so the head after layer ``i``
is profiled once per distinct output spec and reported under layer ``i``'s name::

    heads = head_profiles(graph, profile, "dgl")   # {layer name: LayerProfile of the head after it}
    cost = CostModel(profile, cluster).with_heads({cluster.devices[0].kind: heads})

The head is profiled the way its profile's layers were, on the same grid of micro-batch sizes and at
the same precision (under autocast, or traced in the compute dtype; :mod:`pipetrain.profile.autocast`):

* an *estimated* profile (``source`` starting with ``estimated``) gets estimated heads: the head
  and its loss are traced on the meta device and costed with the per-kernel roofline of
  :mod:`pipetrain.profile.estimate` on the profile's device model;
* a *measured* profile gets measured heads: timed on ``profile.device`` as
  :mod:`pipetrain.profile.measure` times a layer (one thread, median of ``repeats``), with each
  optimizer's step over the head's parameters measured (:mod:`pipetrain.profile.optimizer_step`).

Either way the head's saved bytes per sample (what its forward keeps for its backward, its input
counted where saved) are counted on the meta device (:func:`~pipetrain.profile.stats.layer_stats`),
for the activation memory a local stage holds (:meth:`~pipetrain.cost.CostModel.head_saved_bytes`).
``width`` sizes the heads (:func:`~pipetrain.graph.aux_heads.build_aux_head`; default the runtime's).

No entry is made for the last layer: the last stage uses the model's own loss, already in the profile.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import replace

import torch
from torch import nn

from pipetrain.cluster import device_model
from pipetrain.graph.aux_heads import AUX_WIDTH, AuxHead, AuxKind, build_aux_head, check_aux
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.profile.autocast import autocast_region
from pipetrain.profile.estimate import kernel_seconds, trace_kernels
from pipetrain.profile.inputs import sample_input
from pipetrain.profile.optimizer_step import time_steps
from pipetrain.profile.precision import compute_dtype
from pipetrain.profile.stats import layer_stats
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.profile.timing import _time_layer, _Timer, _torch_threads

__all__ = ["head_profiles"]


class _HeadLoss(nn.Module):
    """A head with its targets and the model's own loss bound: ``h [b, *out]`` → the local loss (0-d),
    like a layer (a job's other loss of the same output costs about the same)."""

    def __init__(self, head: AuxHead, y: torch.Tensor, x: torch.Tensor, loss: LossKind) -> None:
        super().__init__()
        self.head, self.y, self.x, self.loss = head, y, x, functools.partial(loss_sum, loss)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b = h.shape[0]
        value: torch.Tensor = self.head(h, self.y[:b], self.x[:b], self.loss)
        return value


def _bound(graph: LayerGraph, kind: AuxKind, spec: TensorSpec, b: int, device: torch.device, width: int) -> _HeadLoss:
    """The ``width``-wide head for outputs ``spec`` with ``b`` samples of targets and inputs on ``device``."""
    head = build_aux_head(kind, graph, spec, 0, 2, width)
    head = head.to_empty(device=device) if device.type == "meta" else head.to(device)
    generator = torch.Generator().manual_seed(graph.seed)
    y = sample_input(graph.target, b, device, generator)
    x = sample_input(graph.input, b, device, generator)
    return _HeadLoss(head, y, x, graph.loss)


def _parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _saved(graph: LayerGraph, kind: AuxKind, spec: TensorSpec, b: int, width: int,
           dtype: torch.dtype) -> tuple[int, int]:
    """The head's saved bytes per sample and, of them, its input's: one forward on the meta device."""
    module = _bound(graph, kind, spec, b, torch.device("meta"), width).to(dtype)
    h = torch.empty((b, *spec.shape), dtype=dtype if spec.torch_dtype.is_floating_point else spec.torch_dtype,
                    device="meta")
    stats, _ = layer_stats(module, h)
    return stats.saved_bytes_per_sample, stats.saved_input_bytes_per_sample


def _estimated(graph: LayerGraph, kind: AuxKind, spec: TensorSpec, profile: Profile, name: str,
               width: int) -> LayerProfile:
    """The head after layer ``name`` costed on the profile's device model (module docstring)."""
    device = device_model(profile.device)
    grid = profile.layers[0].sizes
    module = _bound(graph, kind, spec, grid[-1], torch.device("meta"), width)
    master_bytes = _parameter_bytes(module)
    dtype = compute_dtype(profile.precision)
    module.to(dtype)  # at the profile's precision, as its layers (pipetrain.profile.estimate)
    forward_s, backward_s = [], []
    for b in grid:
        h = torch.empty((b, *spec.shape), dtype=dtype if spec.torch_dtype.is_floating_point else spec.torch_dtype,
                        device="meta")
        forward, backward = trace_kernels(module, h)
        forward_s.append(sum(kernel_seconds(k, device, profile.precision) for k in forward))
        backward_s.append(sum(kernel_seconds(k, device, profile.precision) for k in backward))
    saved, saved_input = _saved(graph, kind, spec, grid[-1], width, dtype)
    return LayerProfile(name, grid, tuple(forward_s), tuple(backward_s), 0, saved, master_bytes, 0.0,
                        saved_input_bytes_per_sample=saved_input)


def _measured(graph: LayerGraph, kind: AuxKind, spec: TensorSpec, profile: Profile, name: str,
              repeats: int, width: int) -> LayerProfile:
    """The head after layer ``name`` timed on ``profile.device`` (module docstring)."""
    timer = _Timer(torch.device(profile.device), 2, repeats)
    grid = profile.layers[0].sizes
    module = _bound(graph, kind, spec, grid[-1], timer.device, width)
    generator = torch.Generator().manual_seed(graph.seed + 1)
    h = sample_input(spec, grid[-1], timer.device, generator)
    times = []
    with _torch_threads(1), torch.enable_grad(), autocast_region(timer.device, profile.precision):
        for b in grid:
            times.append(_time_layer(timer, module, h[:b], torch.ones((), device=timer.device), split=False))
        steps = time_steps(timer, module)
    saved, saved_input = _saved(graph, kind, spec, grid[-1], width, compute_dtype(profile.precision))
    return LayerProfile(name, grid, tuple(t[0] for t in times), tuple(t[1] for t in times), 0, saved,
                        _parameter_bytes(module), 0.0, steps.pop("sgd"), optimizer_step_s=steps,
                        saved_input_bytes_per_sample=saved_input)


def head_profiles(graph: LayerGraph, profile: Profile, kind: str, *, repeats: int = 5,
                  after: Collection[str] | None = None, width: int = AUX_WIDTH) -> dict[str, LayerProfile]:
    """Per layer but the last, the cost of an auxiliary head of ``kind`` after it (module docstring).

    Args:
        graph: the model ``profile`` profiles.
        profile: its layers' profile; estimated heads for an estimated one, else measured heads.
        kind: ``linear``, ``dgl`` or ``infopro``.
        repeats: timed runs per size of a measured head (the median is kept).
        after: only the heads after these layers (a plan's stage ends); default every layer but the last.
        width: the heads' width (:func:`~pipetrain.graph.aux_heads.build_aux_head`).

    Raises:
        UserError: an unknown kind, or a model output no head predicts
            (:func:`~pipetrain.graph.aux_heads.check_aux`).
    """
    aux = check_aux(graph, kind)
    specs = graph.output_specs()[:-1]
    estimated = profile.source.startswith("estimated")
    by_spec: dict[TensorSpec, LayerProfile] = {}
    heads = {}
    for layer, spec in zip(graph.layers, specs, strict=False):
        if after is not None and layer.name not in after:
            continue
        if spec not in by_spec:
            by_spec[spec] = (_estimated(graph, aux, spec, profile, layer.name, width) if estimated
                             else _measured(graph, aux, spec, profile, layer.name, repeats, width))
        heads[layer.name] = replace(by_spec[spec], name=f"aux:{layer.name}")
    return heads
