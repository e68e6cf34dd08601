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
* once per layer, the seconds of each optimizer's step over its parameters (``step_s``, SGD's, and
  ``optimizer_step_s``) and of its share of clipping the gradient norm (``clip_s``), with the
  optimizers the runtime builds (:mod:`.optimizer_step`);
* once per size, the whole model's forward and backward (with the loss): every layer's times at
  that size are scaled by its ratio to the sum of the layers' (layers timed alone find the caches
  as a training step, running them in sequence, does not leave them);

each after ``warmup`` untimed runs, as the median of ``repeats`` timed runs; a median whose runs
spread by more than ±10% is timed again (up to twice more), and the profile's ``noise`` records the
spreads and the machine's load, with a warning when they stay high (:mod:`.noise`). Layers are fed real
data: layer ``i`` sees layer ``i - 1``'s output on the (seeded) random input, so data-dependent
kernels (embedding look-ups, ReLU sparsity) behave as in training. Once per layer, at the largest
size, one forward also yields the per-sample byte and FLOP counts of :class:`LayerStats`. A layer
whose BatchNorm cannot train on one sample (:mod:`pipetrain.graph.batch_norm`) is timed from 2
samples up and its size-1 times extrapolated; the profile's ``source`` and a log line say so.

At a mixed ``precision`` (``bf16``, ``fp16``) all of it runs under ``torch.autocast`` in the compute
dtype, as the runtime runs a stage's forward (:mod:`.autocast`): the times are autocast's (each
forward casting the weights), the output bytes those of the compute-dtype message, the saved bytes
what autograd keeps under autocast, with the parameters' casts apart (``cast_weight_bytes``, per
micro-batch), the parameter bytes float32 (the master weights).

The parts: the size grid, random samples and the loss (:mod:`.inputs`), the timer of one layer
(:mod:`.timing`), the walk over the layers (:mod:`.per_layer`) and the whole model's ratios
(:mod:`.composition`); this module checks the arguments and runs them, under the runtime's
allocator settings and the requested thread count.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Sequence

import torch

from pipetrain.allocator import keep_freed_memory
from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import batch_norms
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.profile.autocast import autocast_region, unsupported
from pipetrain.profile.composition import _composition_ratios, _scaled
from pipetrain.profile.inputs import LossFn, extrapolated_note, model_loss_fn, size_grid, trainable_grid
from pipetrain.profile.noise import ProfileNoise, load_average, noise_warning
from pipetrain.profile.per_layer import _measure_layers
from pipetrain.profile.precision import Precision
from pipetrain.profile.stats import tied_bytes
from pipetrain.profile.table import Profile
from pipetrain.profile.timing import _Timer, _torch_threads

__all__ = ["measure_profile"]

log = logging.getLogger(__name__)


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
    precision: Precision = "fp32",
) -> Profile:
    """Time every layer of ``graph`` at every micro-batch size of the grid.

    Args:
        graph: the model.
        batch_size: the mini-batch size B; the default grid is 1, 2, 4, … below B, and B.
        sizes: an explicit grid of micro-batch sizes instead.
        warmup, repeats: untimed runs before each measurement, then timed runs (median kept; up to
            two more rounds of ``repeats`` when they spread by more than ±10%, :mod:`.noise`).
        threads: torch intra-op threads while measuring (restored after; None: keep); one per rank.
        device: a torch device string (``"cpu"``, ``"cuda:0"``).
        progress: show a progress bar over (layer, size) pairs on stderr.
        loss: the training loss timed on the last layer (:data:`LossFn`; default ``graph.loss``).
        precision: ``"fp32"``, or ``"bf16"``/``"fp16"`` measured under autocast (module docstring).

    Returns a Profile whose ``device`` is the device type (``"cpu"``, ``"cuda"``) and whose ``noise``
    says how steady the timings were; unsteady ones are also logged as a warning.

    Raises:
        UserError: a non-positive batch size, size, repeat count or thread count; a grid that
            BatchNorm cannot train on (:func:`trainable_grid`); a model that cannot run under
            ``precision``'s autocast on ``device`` (fp16 on a CPU, :func:`~.autocast.unsupported`).
    """
    keep_freed_memory()  # time layers under the allocator settings the runtime trains with
    norms = batch_norms(graph)
    grid = trainable_grid(graph.name, norms, size_grid(batch_size, sizes))
    if repeats < 1 or warmup < 0 or (threads is not None and threads < 1):
        raise UserError(f"need repeats >= 1, warmup >= 0 and threads >= 1 (or None); "
                        f"got repeats={repeats}, warmup={warmup}, threads={threads}")
    timer = _Timer(torch.device(device), warmup, repeats)
    loss_fn = loss or model_loss_fn(graph)
    load_start = load_average()
    with _torch_threads(threads) as used, autocast_region(timer.device, precision):
        try:
            layers, loss_bytes = _measure_layers(graph, grid, timer, progress, loss_fn, norms.single_value)
            ratios = _composition_ratios(graph, layers, timer, loss_fn, norms.smallest_microbatch)
        except RuntimeError as e:
            if precision == "fp32":
                raise
            raise unsupported(graph.name, precision, timer.device, e) from None
    noise = ProfileNoise.summarise(timer.noise, repeats, load_start, load_average(), os.cpu_count())
    warning = noise_warning(noise)
    if warning is not None:
        log.warning(warning)
    return Profile(
        model=graph.name,
        fingerprint=graph.fingerprint(),
        device=timer.device.type,
        source=f"measured on {timer.device}{_autocast_note(precision)}, {used} thread{'' if used == 1 else 's'}, "
               f"median of {repeats}; layers "
               f"scaled x{statistics.median(ratios):.3f} (median over sizes) to the whole model's time"
               f"{extrapolated_note(norms, grid)}",
        input_bytes_per_sample=graph.input.bytes_per_sample,
        edges=() if graph.is_chain else tuple(graph.edges),
        ties=tied_bytes(graph),
        layers=tuple(_scaled(lp, ratios) for lp in layers),
        loss_saved_bytes_per_sample=loss_bytes,
        precision=precision,
        noise=noise,
    )


def _autocast_note(precision: Precision) -> str:
    """What the profile's ``source`` says of a mixed precision (nothing at fp32)."""
    return "" if precision == "fp32" else f" under {precision} autocast"
