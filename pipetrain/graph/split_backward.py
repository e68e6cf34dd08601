"""The split backward of method ``zb1``: B (input gradients) and W (weight gradients).

Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2: B computes the gradient
of the stage input and of every activation inside the stage; W then computes the weight gradients
from the gradients of the activations that the weights produced, which B already has.

The split is made per *parameter owner*: every module of the stage that holds trainable parameters
of its own (an ``nn.Linear``, ``nn.LayerNorm``, ``nn.Embedding``, ...). Data (``b`` samples of the
micro-batch): the forward (:func:`layer_outputs`) records, per call of an owner, its output
``o_i [b, *out_i]`` and its own parameters (and, for an ``nn.Linear``, its input ``a_i [b, *in_i]``).
B (:func:`input_grads`) asks autograd for the gradients of ``x [b, *in]`` and of every ``o_i`` in
one pass, keeping the graph; autograd skips every weight gradient, since no parameter is asked for.
W (:func:`weight_grads`) computes each owner's weight gradients from ``g_i``: for an ``nn.Linear``
directly (``dW += g_iᵀ a_i``, ``db += Σ g_i``, one matmul accumulating in place, as the paper's W
is), for any other owner by ``backward(o_i, g_i, inputs=params_i)``, which reaches only that owner's
weights. B and W together then cost about one ordinary backward. (A per-layer split instead made W
re-walk every layer with several weights inside: a transformer block's W cost as much as its whole
backward, B + W 1.6-2.1x the backward on gpt-tiny's blocks.)

That per-owner W is exact only when each parameter is reached from one recorded output and no
recorded tensor was modified in place after it was recorded. When a stage breaks either rule
(weights shared between modules or a module called twice, an owner whose output is not one tensor,
an in-place op on a recorded tensor), W falls back to one ``backward(y, g, inputs=all parameters)``
over the whole stage: correct, at the cost of re-walking the stage.

B keeps the ``g_i`` until W: one gradient per owner output per pending micro-batch. The profile
records their bytes per layer (:func:`pipetrain.profile.stats.held_grad_bytes`), the memory model
holds them from B to W beside the saved activations (:class:`pipetrain.simulate.memory.ActivationLedger`)
and the runtime meters them (:meth:`pipetrain.runtime.interp.memory.ActivationMeter.hold`).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Owner", "StageParts", "WeightWork", "input_grads", "layer_outputs", "weight_grads"]


@dataclass(frozen=True)
class Owner:
    """One call of a parameter owner: its output ``o_i``, its own trainable parameters, for a plain
    ``nn.Linear`` its input ``a_i`` (its W is computed directly; else None), and the recorded
    tensors' versions."""

    output: torch.Tensor
    params: list[nn.Parameter]
    input: torch.Tensor | None
    versions: tuple[int, int]

    def unchanged(self) -> bool:
        """No in-place op changed the recorded output or input since the call."""
        return (self.output._version, -1 if self.input is None else self.input._version) == self.versions


WeightWork = list[tuple[Owner, torch.Tensor]]
"""What W does: per owner call, the call and the gradient of its output."""


@dataclass(frozen=True)
class StageParts:
    """What one forward recorded for its split backward.

    Attributes:
        owners: per owner call, in call order.
        complete: every trainable parameter of the stage is in exactly one owner call.
        params: every trainable parameter of the stage (the fallback's W).
    """

    owners: list[Owner]
    complete: bool
    params: list[nn.Parameter]

    def exact(self) -> bool:
        """The per-owner W is exact: complete, and no recorded tensor changed in place since."""
        return self.complete and all(o.unchanged() for o in self.owners)


def _direct_input(module: nn.Module, args: tuple[object, ...], out: torch.Tensor) -> torch.Tensor | None:
    """The input of a plain ``nn.Linear`` call whose W can be computed directly, else None."""
    if type(module) is not nn.Linear or len(args) != 1 or torch.is_autocast_enabled():
        return None
    inp = args[0]
    if not isinstance(inp, torch.Tensor) or not inp.dtype == out.dtype == module.weight.dtype:
        return None
    return inp


def _record(owners: list[Owner], module: nn.Module, own: list[nn.Parameter], args: tuple[object, ...],
            out: object) -> None:
    """The forward hook: record the call when its output is one tensor that takes a gradient."""
    if not (isinstance(out, torch.Tensor) and out.requires_grad):
        return
    inp = _direct_input(module, args, out)
    owners.append(Owner(out, own, inp, (out._version, -1 if inp is None else inp._version)))


class _Recorder:
    """The forward hooks that record one stage module's owner calls; outside a recording they return
    at once. The runtime keeps one per stage (registering the hooks on every forward cost ~10 µs per
    owner: ~150 µs per forward of half of gpt-tiny); the profiler removes its own, so that its timed
    plain forwards run without hooks."""

    def __init__(self, module: nn.Module) -> None:
        self.owners: list[Owner] | None = None
        self._handles = [m.register_forward_hook(functools.partial(self._hook, own))
                         for m in module.modules() if (own := list(m.parameters(recurse=False)))]

    def _hook(self, own: list[nn.Parameter], module: nn.Module, args: tuple[object, ...], out: object) -> None:
        if self.owners is None:
            return
        trainable = [p for p in own if p.requires_grad]
        if trainable:  # a module whose parameters are all frozen is no owner (as before the hooks were kept)
            _record(self.owners, module, trainable, args, out)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


_KEPT: weakref.WeakKeyDictionary[nn.Module, _Recorder] = weakref.WeakKeyDictionary()


def layer_outputs(module: nn.Module, x: torch.Tensor, *, keep_hooks: bool = False) -> tuple[torch.Tensor, StageParts]:
    """Run the stage on ``x``, recording each parameter owner's call; the stage's output and the record.
    ``keep_hooks``: leave the recording hooks on ``module`` for its next call (the runtime's stages)."""
    recorder = _KEPT.get(module) if keep_hooks else None
    if recorder is None:
        recorder = _Recorder(module)
        if keep_hooks:
            _KEPT[module] = recorder
    owners: list[Owner] = []
    recorder.owners = owners
    try:
        y = module(x)
    finally:
        recorder.owners = None
        if not keep_hooks:
            recorder.remove()
    params = [p for p in module.parameters() if p.requires_grad]
    seen = [id(p) for o in owners for p in o.params]
    complete = len(seen) == len(set(seen)) == len(params)
    return y, StageParts(owners, complete, params)


def input_grads(y: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor,
                record: StageParts) -> tuple[torch.Tensor | None, WeightWork]:
    """B: the gradient of ``x`` (None when ``x`` takes none) and the work W needs, from one pass that
    keeps the graph. ``y`` is the stage's output (the last stage: its loss), ``grad`` its gradient."""
    owners = record.owners if record.exact() else [Owner(y, record.params, None, (0, -1))]
    owners = [o for o in owners if o.output.requires_grad and o.params]
    targets = ([x] if x.requires_grad else []) + [o.output for o in owners]
    if not targets or not y.requires_grad:
        return (torch.zeros_like(x) if x.requires_grad else None), []
    grads = torch.autograd.grad(y, targets, grad, retain_graph=True, allow_unused=True)
    x_grad = (grads[0] if grads[0] is not None else torch.zeros_like(x)) if x.requires_grad else None
    work = [(o, g) for o, g in zip(owners, grads[len(targets) - len(owners):], strict=True) if g is not None]
    return x_grad, work


def _linear_weight_grads(inp: torch.Tensor, g: torch.Tensor, params: list[nn.Parameter]) -> None:
    """A plain linear's ``dW += gᵀ a`` (its 2-D weight ``[out, in]``) and ``db += Σ g`` (its 1-D bias)
    over every leading dimension (``g [.., out]``, ``a [.., in]``).

    The first micro-batch of a step assigns ``.grad``; every later one accumulates with one in-place
    ``addmm_`` into it, so the product is never materialised apart: a ``gᵀ a`` temporary and a
    separate ``+=`` would read and write the weight's bytes three more times and allocate them once
    per micro-batch (on the mlp's 1024-4096 layers at 16 samples, W took 1.8× as long that way,
    benchmarks/bench_action_cost.py)."""
    g2, a2 = g.reshape(-1, g.shape[-1]), inp.reshape(-1, inp.shape[-1])
    for p in params:
        if p.grad is None:
            p.grad = g2.t() @ a2 if p.dim() == 2 else g2.sum(0)
        elif p.dim() == 2:
            p.grad.addmm_(g2.t(), a2)
        else:
            p.grad.add_(g2.sum(0))


def weight_grads(work: WeightWork) -> None:
    """W: each owner's weight gradients, accumulated into ``.grad``, latest owner first. The graph is
    kept until the work is dropped (an owner nested in another shares its nodes), then freed."""
    for o, g in reversed(work):
        if o.input is None:
            torch.autograd.backward(o.output, g, inputs=o.params, retain_graph=True)
        else:
            with torch.no_grad():
                _linear_weight_grads(o.input.detach(), g, o.params)
