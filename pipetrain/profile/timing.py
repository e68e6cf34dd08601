"""How the profilers time a layer: median seconds of its forward, backward, B and W.

For one layer on one micro-batch ``x`` (``[b, ...]``) :func:`_time_layer` times, as docs/algorithms.md
§2.6 asks of UMPIPE's profiler and §3.2 of PipeDream's, the forward ``module(x)`` with autograd
recording, the backward of that layer alone for a given output gradient, and the two parts of a
split backward (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) as the runtime runs them
(:mod:`pipetrain.graph.split_backward`); :mod:`.optimizer_step` times the optimizers' steps over
its parameters. Each is the median of ``repeats`` runs after ``warmup`` untimed ones (:class:`_Timer`,
which times by the device's clock, CUDA events on a GPU, and keeps every run's result alive until
all are done, as training keeps activations); an unstable one is timed again and every one's spread
logged (:mod:`.noise`). :func:`_torch_threads` fixes torch's intra-op threads
while timing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from pipetrain.graph.split_backward import input_grads, layer_outputs, weight_grads
from pipetrain.profile import noise as noise_model
from pipetrain.profile.clock import device_clock
from pipetrain.profile.noise import NoiseLog, steadiest

__all__: list[str] = []


@dataclass(frozen=True)
class _Timer:
    """Median seconds of a callable: wall clock on a CPU; on CUDA, events around it
    (:mod:`pipetrain.profile.clock`), after synchronising the device so that earlier work is done.

    A median whose runs spread by more than :data:`~.noise.UNSTABLE_SPREAD` is timed again, up to
    ``extra_rounds`` more rounds, the steadiest kept (:func:`~.noise.steadiest`); ``noise`` logs every
    median's spread."""

    device: torch.device
    warmup: int
    repeats: int
    extra_rounds: int | None = None
    """More rounds for an unstable median; None: :data:`~.noise.EXTRA_ROUNDS`, read when timing."""
    noise: NoiseLog = field(default_factory=NoiseLog, compare=False)

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
        (:func:`~pipetrain.allocator.keep_freed_memory`) and the smaller sizes fit in it.
        """
        grow = [prepare()() for _ in range(self.warmup + self.repeats)]
        del grow

    def median_s(self, prepare: Callable[[], Callable[[], object]]) -> float:
        """Median time of ``prepare()()`` over ``repeats`` runs after ``warmup``; ``prepare``
        itself (untimed) sets up one run. Every run's result stays alive until the round's runs are
        done (see :meth:`grow_heap`, which should have run first at the largest size). An unstable
        round is followed by more, without warm-up, and the steadiest one's median kept (class
        docstring)."""
        median, spread, rounds = steadiest(lambda i: self._round(prepare, self.warmup if i == 0 else 0),
                                           extra_rounds=noise_model.EXTRA_ROUNDS if self.extra_rounds is None
                                           else self.extra_rounds)
        self.noise.add(median, spread, retimed=rounds > 1)
        return median

    def _round(self, prepare: Callable[[], Callable[[], object]], warmup: int) -> list[float]:
        """The seconds of ``repeats`` runs of ``prepare()()`` after ``warmup`` untimed ones."""
        times = []
        kept = []
        clock = device_clock(self.device)
        for k in range(warmup + self.repeats):
            timed = prepare()
            self._sync()
            start = clock.mark()
            kept.append(timed())
            elapsed = clock.seconds(start, clock.mark())
            if k >= warmup:
                times.append(elapsed)
        del kept
        return times


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
