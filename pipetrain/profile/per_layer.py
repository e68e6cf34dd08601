"""The profiler's walk over the layers: each timed on the previous one's output, the loss on the last.

:func:`_measure_layers` feeds layer ``i`` layer ``i - 1``'s output on a seeded random input
(``[max(grid), ...]``), so data-dependent kernels (embedding look-ups, ReLU sparsity) behave as in
training, and records per layer (:func:`_measure_layer`) a
:class:`~pipetrain.profile.table.LayerProfile`: the :mod:`.timing` of every size of the grid, slices
``[b, ...]`` of that input, and, from one forward at the largest size, the per-sample byte and FLOP
counts of :func:`~pipetrain.profile.stats.layer_stats`. The loss's forward and backward are added
to the last layer (:func:`_with_loss`). The allocator's heap is grown to the training working set
first (:func:`_warm_heap`), and again per layer at its largest size, so that no timed run pays for
fresh pages that training steps do not.

A layer whose BatchNorm cannot train on one sample (``single_value``,
:class:`~pipetrain.graph.batch_norm.BatchNorms`) is timed from 2 samples up, and its size-1 times
are extrapolated (:func:`~pipetrain.profile.inputs.filled_below`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from pipetrain.graph.dataflow import layer_input, profiled_layer
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.profile.inputs import LossFn, _scaled_loss, filled_below, loss_saved_bytes, sample_input
from pipetrain.profile.optimizer_step import time_clip, time_steps
from pipetrain.profile.stats import layer_stats
from pipetrain.profile.table import LayerProfile
from pipetrain.profile.timing import _time_layer, _Timer

__all__: list[str] = []


def _progress_bar(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _measure_layer(
    name: str, module: nn.Module, x: torch.Tensor, grid: tuple[int, ...], timer: _Timer,
    generator: torch.Generator, on_size: Callable[[str], None], smallest: int = 1,
) -> tuple[LayerProfile, torch.Tensor]:
    """One layer's profile on input ``x`` (``[max(grid), …]``), and its output on ``x``; timed at
    the sizes from ``smallest`` up, the smaller ones extrapolated (module docstring).

    ``on_size`` is called with a label after each size of the grid (it drives the progress bar).
    """
    stats, out = layer_stats(module, x)
    has_backward = out.requires_grad
    out = out.detach()  # drops the graph of the stats pass
    grads = [torch.randn(out[:b].shape, generator=generator).to(timer.device, out.dtype) for b in grid]
    _time_layer(timer, module, x[:grid[-1]], grads[-1] if has_backward else None, grow_heap=True)
    times = []
    for b, grad in zip(grid, grads, strict=True):
        if b >= smallest:
            times.append(_time_layer(timer, module, x[:b], grad if has_backward else None))
        on_size(f"{name} b={b}")
    steps = time_steps(timer, module)
    forward_s, backward_s, input_grad_s, weight_grad_s = (filled_below(grid, tuple(column))
                                                          for column in zip(*times, strict=True))
    profile = LayerProfile(
        name=name,
        sizes=grid,
        forward_s=forward_s,
        backward_s=backward_s,
        input_grad_s=input_grad_s,
        weight_grad_s=weight_grad_s,
        output_bytes_per_sample=stats.output_bytes_per_sample,
        saved_bytes_per_sample=stats.saved_bytes_per_sample,
        parameter_bytes=stats.parameter_bytes,
        flops_per_sample=stats.flops_per_sample,
        step_s=steps["sgd"],
        saved_input_bytes_per_sample=stats.saved_input_bytes_per_sample,
        saved_output_bytes_per_sample=stats.saved_output_bytes_per_sample,
        held_grad_bytes_per_sample=stats.held_grad_bytes_per_sample,
        cast_weight_bytes=stats.cast_weight_bytes,
        optimizer_step_s={opt: s for opt, s in steps.items() if opt != "sgd"},
        clip_s=time_clip(timer, module),
    )
    return profile, out


def _measure_layers(
    graph: LayerGraph, grid: tuple[int, ...], timer: _Timer, progress: bool, loss: LossFn,
    single_value: tuple[str, ...] = (),
) -> tuple[tuple[LayerProfile, ...], int]:
    """Every layer's profile, each fed the previous layer's output on a seeded random input; and the
    loss's saved bytes per sample (:func:`~pipetrain.profile.inputs.loss_saved_bytes`). The layers
    ``single_value`` are timed from 2 samples up (module docstring)."""
    generator = torch.Generator().manual_seed(graph.seed)
    x = sample_input(graph.input, grid[-1], timer.device, generator)
    profiles = []
    with torch.enable_grad(), _progress_bar(progress) as bar:
        task = bar.add_task("profiling", total=len(graph) * len(grid))

        def on_size(description: str) -> None:
            bar.update(task, description=description, advance=1)

        modules = [profiled_layer(graph, i, timer.device) for i in range(len(graph))]
        for _ in range(2):
            _warm_heap(graph, modules, x)
        model_input, outputs = x, list[torch.Tensor]()
        for i, (layer, module) in enumerate(zip(graph.layers, modules, strict=True)):
            profile, x = _measure_layer(layer.name, module, layer_input(graph, i, model_input, outputs), grid, timer,
                                        generator, on_size, 2 if layer.name in single_value else 1)
            profiles.append(profile)
            outputs.append(x)
        profiles[-1] = _with_loss(profiles[-1], graph, x, timer, generator, loss)
        loss_bytes = loss_saved_bytes(graph, x, profiles[-1].saved_output_bytes_per_sample > 0, generator, loss)
    return tuple(profiles), loss_bytes


def _with_loss(
    last: LayerProfile, graph: LayerGraph, out: torch.Tensor, timer: _Timer, generator: torch.Generator, loss_fn: LossFn
) -> LayerProfile:
    """The last layer's profile with the loss's forward and backward added (the last stage runs it;
    in a split backward, its B).

    ``out`` is the last layer's output ``[max(grid), ...]``.
    """
    targets = sample_input(graph.target, out.shape[0], timer.device, generator)
    forward, backward = [], []
    for grow, b in [(True, last.sizes[-1]), *((False, b) for b in last.sizes)]:
        run = timer.grow_heap if grow else timer.median_s  # the heap once, at the largest size
        y = out[:b].detach().requires_grad_(out.is_floating_point())
        loss: Callable[[], torch.Tensor] = functools.partial(_scaled_loss, loss_fn, y, targets[:b], out.shape[0])
        f = run(functools.partial(_identity, loss)) or 0.0
        g = (run(functools.partial(_backward_of, loss)) or 0.0) if y.requires_grad else 0.0
        if not grow:
            forward.append(f)
            backward.append(g)

    def plus(values: tuple[float, ...], extra: list[float]) -> tuple[float, ...]:
        return tuple(v + e for v, e in zip(values, extra, strict=True))

    return replace(last, forward_s=plus(last.forward_s, forward), backward_s=plus(last.backward_s, backward),
                   input_grad_s=None if last.input_grad_s is None else plus(last.input_grad_s, backward))


def _identity(run: Callable[[], torch.Tensor]) -> Callable[[], object]:
    return run


def _backward_of(run: Callable[[], torch.Tensor]) -> Callable[[], object]:
    """Run the forward now (untimed); return its backward, to be timed."""
    return functools.partial(torch.autograd.backward, run())


def _warm_heap(graph: LayerGraph, modules: Sequence[nn.Module], model_input: torch.Tensor) -> None:
    """One untimed forward and backward of the whole model at the largest size.

    It grows the allocator's heap to the training working set, so the first layer timed does
    not pay the page faults of fresh memory that later layers (and training steps) do not.
    """
    outputs: list[torch.Tensor] = []
    for i, module in enumerate(modules):
        x = layer_input(graph, i, model_input, outputs).detach()
        outputs.append(module(x.requires_grad_(x.is_floating_point())))
    x = outputs[-1]
    if x.requires_grad:
        torch.autograd.backward(x.float().sum())
    del outputs
