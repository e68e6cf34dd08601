"""Layers that normalise over the micro-batch (BatchNorm), and the smallest micro-batch they train on.

    norms = batch_norms(graph)
    norms.modules               # ('stem.1', 'layer1.0.bn1', ...): the model's names of its BatchNorms
    norms.smallest_microbatch   # 2 when some BatchNorm sees one value per channel of a sample, else 1

A BatchNorm (``nn.BatchNorm1d/2d/3d``, ``SyncBatchNorm``: every ``_BatchNorm``) in training mode
normalises each channel of its input ``[b, C, *spatial]`` over the ``b · prod(spatial)`` values of
the *micro-batch*, and torch refuses a single value ("Expected more than 1 value per channel when
training"). So a BatchNorm after a flatten (``[b, C]``) or at a 1×1 feature map (ResNet-18 at 32×32
ends at 1×1) cannot train on a micro-batch of one sample: the profilers do not time it there, the
planners do not cut micro-batches that small, and training refuses a plan that does. One that
sees several values per channel (a 4×4 map) trains on one sample, with that sample's statistics.
Either way its statistics, and so the training, depend on the micro-batching, which the planning
and training entry points say once (GPipe, Huang et al. 2019, documents the same).

Normalisers of one sample (``InstanceNorm``, ``LayerNorm``, ``GroupNorm``) do not depend on the
micro-batch and are not listed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.graph.layer_graph import LayerGraph

__all__ = ["BatchNorms", "batch_norms", "listed"]

_BATCH_NORMS = (nn.modules.batchnorm._BatchNorm,)


@dataclass(frozen=True)
class BatchNorms:
    """A model's BatchNorms.

    Attributes:
        modules: the model's names of its BatchNorm modules (``layer1.0.bn1``), in layer order.
        layers: the graph layers that hold one, in order.
        single_value: of ``layers``, those with a BatchNorm that sees one value per channel of a
            sample (its input is ``[b, C]`` or ``[b, C, 1, ...]``): they train on 2 samples or more.
    """

    modules: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    single_value: tuple[str, ...] = ()

    @property
    def smallest_microbatch(self) -> int:
        """The fewest samples every layer of the model trains on: 2 with a ``single_value`` layer, else 1."""
        return 2 if self.single_value else 1

    def named(self) -> str:
        """The BatchNorm modules for a one-line message (:func:`listed`)."""
        return listed(self.modules)


def listed(names: tuple[str, ...], most: int = 3) -> str:
    """``names`` for a one-line message: ``a, b, c and 4 more``."""
    rest = len(names) - most
    return ", ".join(names[:most]) + (f" and {rest} more" if rest > 0 else "")


def _module_name(prefix: str, local: str) -> str:
    """The model's name of a module called ``local`` in a layer whose state names start with ``prefix``."""
    return f"{prefix}{local}" if local else prefix.removesuffix(".")


@contextmanager
def _recording(module: nn.Module, shapes: list[torch.Size]) -> Iterator[None]:
    """While inside, add to ``shapes`` the input shape of every BatchNorm of ``module`` that runs.

    The shapes say whether each trains on one sample (:func:`_smallest_trainable`); the hooks only
    read shapes, so they work on the meta device too.
    """
    handles = [m.register_forward_pre_hook(lambda _m, args: shapes.append(args[0].shape))
               for m in module.modules() if isinstance(m, _BATCH_NORMS)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _smallest_trainable(shapes: list[torch.Size]) -> int:
    """The smallest micro-batch BatchNorms with inputs of ``shapes`` (``[b, C, *spatial]``) train on:
    2 when one sees a single value per channel of a sample, else 1."""
    return 2 if any(math.prod(shape[2:]) == 1 for shape in shapes) else 1


def batch_norms(graph: LayerGraph) -> BatchNorms:
    """The BatchNorms of ``graph``, found by one forward of 2 samples on the meta device (no memory,
    no arithmetic), and which of them cannot train on one sample.

    A layer that cannot run on the meta device (data-dependent shapes), and every layer after it,
    has no shapes to judge by: its BatchNorms count as unable to train on one sample, the safe side.
    """
    built = [graph.build_layer(i, device="meta") for i in range(len(graph))]
    if not any(isinstance(m, _BATCH_NORMS) for module in built for m in module.modules()):
        return BatchNorms()  # no forward needed (nor its first-call cost, about a second)
    x = torch.empty((2, *graph.input.shape), dtype=graph.input.torch_dtype, device="meta")
    outputs: list[torch.Tensor | None] = []
    modules: list[str] = []
    layers: list[str] = []
    single: list[str] = []
    for i, (layer, module) in enumerate(zip(graph.layers, built, strict=True)):
        names = [name for name, m in module.named_modules() if isinstance(m, _BATCH_NORMS)]
        shapes: list[torch.Size] = []
        outputs.append(_meta_forward(module, [outputs[j] for j in graph.predecessors(i)] or [x], shapes))
        modules += [_module_name(layer.qualified(""), name) for name in names]
        layers += [layer.name] if names else []
        unknown = outputs[-1] is None and bool(names)
        single += [layer.name] if unknown or _smallest_trainable(shapes) > 1 else []
    return BatchNorms(tuple(modules), tuple(layers), tuple(single))


def _meta_forward(module: nn.Module, args: list[torch.Tensor | None], shapes: list[torch.Size]) -> torch.Tensor | None:
    """``module(*args)`` on meta tensors, its BatchNorms' input shapes added to ``shapes``; None when
    an input is unknown or the module cannot run on the meta device."""
    if any(a is None for a in args):
        return None
    try:
        with torch.no_grad(), _recording(module, shapes):
            out: torch.Tensor = module(*args)
    except (NotImplementedError, RuntimeError, ValueError):
        return None
    return out
