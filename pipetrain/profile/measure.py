"""Measured profiles: time every layer of a LayerGraph on a real device (docs/architecture.md §2).

    profile = measure_profile(build_model("gpt-tiny"), batch_size=32)

For each layer and each micro-batch size ``b`` of the grid (by default the powers of two below the
batch, and the batch) this records, as docs/algorithms.md §2.6 asks of UMPIPE's profiler and §3.2 of
PipeDream's:

* forward seconds: ``module(x)`` with autograd recording, as in training;
* backward seconds: ``torch.autograd.backward(out, grad)`` of that layer alone, for a random
  ``grad`` (input and weight gradients; the forward that builds the graph is not timed);
* the two parts of a split backward (methods ``zb1``, Qi et al. 2024), timed as the runtime runs
  them (:mod:`pipetrain.graph.split_backward`): B, the input and activation gradients of one pass
  that keeps the graph, and W, the weight gradients from B's activation gradients. B + W is the
  backward plus what splitting costs on this device (about 1.1x the backward on gpt-tiny's blocks
  here), which the planners then weigh against the bubbles it fills;
* once per layer, the seconds of a plain SGD step over its parameters (``step_s``);
* once per size, the whole model's forward and backward (with the loss): every layer's times at
  that size are scaled by its ratio to the sum of the layers' (layers timed alone find the caches
  as a training step, running them in sequence, does not leave them);

each after ``warmup`` untimed runs, as the median of ``repeats`` timed runs. Layers are fed real
data: layer ``i`` sees layer ``i - 1``'s output on the (seeded) random input, so data-dependent
kernels (embedding look-ups, ReLU sparsity) behave as in training. Once per layer, at the largest
size, one forward also yields the per-sample byte and FLOP counts of :class:`LayerStats`.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from pipetrain.allocator import keep_freed_memory
from pipetrain.errors import UserError
from pipetrain.graph.dataflow import layer_input, profiled_layer, whole_model
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec, loss_sum
from pipetrain.graph.split_backward import input_grads, layer_outputs, weight_grads
from pipetrain.profile.stats import SavedStorages, layer_stats
from pipetrain.profile.table import LayerProfile, Profile

__all__ = [
    "LossFn",
    "loss_saved_bytes",
    "measure_profile",
    "model_loss_fn",
    "sample_input",
    "size_grid",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(output [b, ...], target [b, ...])``: the sum over the ``b`` samples of each one's loss."""


def size_grid(batch_size: int, sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The micro-batch sizes to profile, increasing.

    Args:
        batch_size: the mini-batch size B.
        sizes: explicit sizes; ``None`` means the powers of two below B, and B itself.

    Raises:
        UserError: B or a size is not a positive integer.
    """
    if batch_size < 1:
        raise UserError(f"batch_size must be at least 1, got {batch_size}")
    if sizes is None:
        powers = (1 << k for k in range(batch_size.bit_length()) if 1 << k < batch_size)
        return (*powers, batch_size)
    if not sizes or min(sizes) < 1:
        raise UserError(f"profile sizes must be positive integers, got {list(sizes)}")
    return tuple(sorted(set(sizes)))


def sample_input(
    spec: TensorSpec, b: int, device: torch.device, generator: torch.Generator
) -> torch.Tensor:
    """A random ``[b, *spec.shape]`` tensor: N(0, 1) floats, or integers uniform in ``[0, high)``."""
    shape = (b, *spec.shape)
    if spec.torch_dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(spec.torch_dtype)
    elif spec.high is None:
        raise UserError(f"integer input {spec} has no `high`; give TensorSpec(..., high=N)")
    else:
        x = torch.randint(0, spec.high, shape, generator=generator, dtype=spec.torch_dtype)
    return x.to(device)


def loss_saved_bytes(graph: LayerGraph, out: torch.Tensor, last_saves_output: bool, generator: torch.Generator,
                     loss: LossFn | None = None) -> int:
    """Bytes per sample the loss saves for backward on the last layer's output ``out`` (``[b, …]``),
    with its targets: what it adds to the last stage's saved bytes. ``out`` itself counts only when
    the last layer does not save it already (``last_saves_output``). Works on the meta device.
    ``loss``: the training loss (default: the model's own, ``graph.loss``)."""
    b = out.shape[0]
    y = out.detach().requires_grad_(out.is_floating_point())
    targets = sample_input(graph.target, b, out.device, generator)
    saved = SavedStorages(nn.Module())
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        _scaled_loss(loss or model_loss_fn(graph), y, targets, b)
    return (saved.total_bytes - (saved.bytes_of(y) if last_saves_output else 0)) // b


# ---- timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Timer:
    """Median wall-clock seconds of a callable, synchronising CUDA around it."""

    device: torch.device
    warmup: int
    repeats: int

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def grow_heap(self, prepare: Callable[[], Callable[[], object]]) -> None:
        """Run ``prepare()()`` as often as :meth:`median_s` will, untimed, keeping every result
        alive until the last; then release them all.

        :meth:`median_s` keeps its runs' results (a forward's output and its autograd graph) alive
        until all runs are done, as activations live in training between a micro-batch's forward
        and backward; freeing each output at once lets the next run reuse cache-warm memory and
        measures forwards up to 2× faster than training runs them (seen on gpt-tiny blocks on a CPU).
        Keeping them alive grows the heap, and the first touch of new pages is slow: in a fresh
        process, gpt-tiny block forwards at 16–64 samples measured 10× their steady-state time.
        Training reuses its heap from step to step, so this pass grows it once, at a layer's
        largest size, before any of its sizes is timed; the allocator keeps the memory
        (:func:`keep_freed_memory`) and the smaller sizes fit in it.
        """
        grow = [prepare()() for _ in range(self.warmup + self.repeats)]
        del grow

    def median_s(self, prepare: Callable[[], Callable[[], object]]) -> float:
        """Median time of ``prepare()()`` over ``repeats`` runs after ``warmup``; ``prepare``
        itself (untimed) sets up one run. Every run's result stays alive until all runs are done
        (see :meth:`grow_heap`, which should have run first at the largest size)."""
        times = []
        kept = []
        for k in range(self.warmup + self.repeats):
            timed = prepare()
            self._sync()
            start = time.perf_counter()
            kept.append(timed())
            self._sync()
            elapsed = time.perf_counter() - start
            if k >= self.warmup:
                times.append(elapsed)
        del kept
        return statistics.median(times)


def _time_layer(
    timer: _Timer, module: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, grow_heap: bool = False,
    split: bool = True,
) -> tuple[float, float, float, float]:
    """Forward, backward, input-gradient (B) and weight-gradient (W) seconds of ``module`` on ``x``
    (module docstring); the last three are 0 when ``grad`` is None, B and W when not ``split``.

    With ``grow_heap`` it only runs :meth:`_Timer.grow_heap` for all four (call it once, at the
    largest size, before timing any size) and returns zeros.
    """
    x = x.detach().requires_grad_(x.is_floating_point())
    run = timer.grow_heap if grow_heap else timer.median_s
    forward_s = run(lambda: functools.partial(module, x)) or 0.0
    if grad is None:
        return forward_s, 0.0, 0.0, 0.0

    def prepare_backward() -> Callable[[], object]:
        return functools.partial(torch.autograd.backward, module(x), grad)

    def prepare_input_grad() -> Callable[[], object]:
        y, record = layer_outputs(module, x)
        return functools.partial(input_grads, y, grad, x, record)

    def prepare_weight_grad() -> Callable[[], object]:
        y, record = layer_outputs(module, x)
        return functools.partial(weight_grads, input_grads(y, grad, x, record)[1])

    whole = run(prepare_backward) or 0.0
    if not split:
        return forward_s, whole, 0.0, 0.0
    return forward_s, whole, run(prepare_input_grad) or 0.0, run(prepare_weight_grad) or 0.0


def _time_step(timer: _Timer, module: nn.Module) -> float:
    """Seconds of a plain SGD step over ``module``'s parameters (0 without parameters).

    Called after ``_time_layer``, so every parameter has a gradient; the step changes weights
    that are no longer needed (the next layer's input was computed before any timing).
    """
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return 0.0
    optimizer = torch.optim.SGD(params, lr=1e-6)
    return timer.median_s(lambda: optimizer.step)


# ---- the profile ----------------------------------------------------------------------------


def _progress_bar(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[int]:
    """Run with ``threads`` intra-op threads (None: unchanged); yields the count in effect."""
    before = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _measure_layer(
    name: str, module: nn.Module, x: torch.Tensor, grid: tuple[int, ...], timer: _Timer,
    generator: torch.Generator, on_size: Callable[[str], None],
) -> tuple[LayerProfile, torch.Tensor]:
    """One layer's profile on input ``x`` (``[max(grid), …]``), and its output on ``x``.

    ``on_size`` is called with a label after each size is timed (it drives the progress bar).
    """
    stats, out = layer_stats(module, x)
    has_backward = out.requires_grad
    out = out.detach()  # drops the graph of the stats pass
    grads = [torch.randn(out[:b].shape, generator=generator).to(timer.device, out.dtype) for b in grid]
    _time_layer(timer, module, x[:grid[-1]], grads[-1] if has_backward else None, grow_heap=True)
    times = []
    for b, grad in zip(grid, grads, strict=True):
        times.append(_time_layer(timer, module, x[:b], grad if has_backward else None))
        on_size(f"{name} b={b}")
    forward_s, backward_s, input_grad_s, weight_grad_s = (tuple(column) for column in zip(*times, strict=True))
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
        step_s=_time_step(timer, module),
        saved_input_bytes_per_sample=stats.saved_input_bytes_per_sample,
        saved_output_bytes_per_sample=stats.saved_output_bytes_per_sample,
        held_grad_bytes_per_sample=stats.held_grad_bytes_per_sample,
    )
    return profile, out


def _measure_layers(
    graph: LayerGraph, grid: tuple[int, ...], timer: _Timer, progress: bool, loss: LossFn
) -> tuple[tuple[LayerProfile, ...], int]:
    """Every layer's profile, each fed the previous layer's output on a seeded random input; and the
    loss's saved bytes per sample (:func:`loss_saved_bytes`)."""
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
                                        generator, on_size)
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


def model_loss_fn(graph: LayerGraph) -> LossFn:
    """The model's own loss (``graph.loss``) as a :data:`LossFn`."""
    return functools.partial(loss_sum, graph.loss)


def _scaled_loss(loss: LossFn, y: torch.Tensor, targets: torch.Tensor, batch: int) -> torch.Tensor:
    return loss(y, targets) / batch


def _forward_backward(model: nn.Module, loss: LossFn, x: torch.Tensor, targets: torch.Tensor,
                      batch: int) -> Callable[[], object]:
    """One training pass of the whole model on ``x`` (``[b, ...]``), to be timed."""
    def run() -> None:
        out = _scaled_loss(loss, model(x), targets, batch)
        if out.requires_grad:
            torch.autograd.backward(out)
    return run


def _composition_ratios(graph: LayerGraph, layers: Sequence[LayerProfile], timer: _Timer,
                        loss: LossFn) -> list[float]:
    """Per grid size, the whole model's forward + backward seconds over the sum of its layers'.

    Layers timed one at a time do not run as the same layers in sequence do: their caches hold
    one layer's weights and activations, not the model's (on a 2-core CPU gpt-tiny's layers in
    sequence took ×1.15 their sum, the mlp's ×0.93). Each ratio is clamped to [0.5, 2].
    """
    model = whole_model(graph).to(timer.device)
    generator = torch.Generator().manual_seed(graph.seed)
    grid = layers[0].sizes
    x = sample_input(graph.input, grid[-1], timer.device, generator)
    targets = sample_input(graph.target, grid[-1], timer.device, generator)

    def prepare(b: int) -> Callable[[], Callable[[], object]]:
        return functools.partial(_forward_backward, model, loss, x[:b], targets[:b], grid[-1])

    timer.grow_heap(prepare(grid[-1]))
    ratios = []
    for i, b in enumerate(grid):
        parts = sum(lp.forward_s[i] + lp.backward_s[i] for lp in layers)
        ratios.append(min(2.0, max(0.5, timer.median_s(prepare(b)) / parts)) if parts > 0 else 1.0)
    return ratios


def _scaled(layer: LayerProfile, ratios: Sequence[float]) -> LayerProfile:
    """``layer`` with every time at grid size ``i`` multiplied by ``ratios[i]``."""
    def times(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if values is None else tuple(v * r for v, r in zip(values, ratios, strict=True))

    forward, backward = times(layer.forward_s), times(layer.backward_s)
    assert forward is not None and backward is not None
    return replace(layer, forward_s=forward, backward_s=backward, input_grad_s=times(layer.input_grad_s),
                   weight_grad_s=times(layer.weight_grad_s))


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


def measure_profile(
    graph: LayerGraph,
    batch_size: int,
    *,
    sizes: Sequence[int] | None = None,
    warmup: int = 2,
    repeats: int = 5,
    threads: int | None = 1,
    device: str = "cpu",
    progress: bool = False,
    loss: LossFn | None = None,
) -> Profile:
    """Time every layer of ``graph`` at every micro-batch size of the grid.

    Args:
        graph: the model.
        batch_size: the mini-batch size B; the default grid is 1, 2, 4, … below B, and B.
        sizes: an explicit grid of micro-batch sizes instead.
        warmup, repeats: untimed runs before each measurement, then timed runs (median kept).
        threads: torch intra-op threads while measuring (restored after; None: keep); one per rank.
        device: a torch device string (``"cpu"``, ``"cuda:0"``).
        progress: show a progress bar over (layer, size) pairs on stderr.
        loss: the training loss timed on the last layer (:data:`LossFn`; default ``graph.loss``).

    Returns a Profile whose ``device`` is the device type (``"cpu"``, ``"cuda"``).

    Raises:
        UserError: a non-positive batch size, size, repeat count or thread count.
    """
    keep_freed_memory()  # time layers under the allocator settings the runtime trains with
    grid = size_grid(batch_size, sizes)
    if repeats < 1 or warmup < 0 or (threads is not None and threads < 1):
        raise UserError(f"need repeats >= 1, warmup >= 0 and threads >= 1 (or None); "
                        f"got repeats={repeats}, warmup={warmup}, threads={threads}")
    timer = _Timer(torch.device(device), warmup, repeats)
    loss_fn = loss or model_loss_fn(graph)
    with _torch_threads(threads) as used:
        layers, loss_bytes = _measure_layers(graph, grid, timer, progress, loss_fn)
        ratios = _composition_ratios(graph, layers, timer, loss_fn)
    return Profile(
        model=graph.name,
        fingerprint=graph.fingerprint(),
        device=timer.device.type,
        source=f"measured on {timer.device}, {used} thread{'' if used == 1 else 's'}, median of {repeats}; layers "
               f"scaled x{statistics.median(ratios):.3f} (median over sizes) to the whole model's time",
        input_bytes_per_sample=graph.input.bytes_per_sample,
        edges=() if graph.is_chain else tuple(graph.edges),
        layers=tuple(_scaled(lp, ratios) for lp in layers),
        loss_saved_bytes_per_sample=loss_bytes,
    )
