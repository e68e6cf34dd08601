"""Estimated profiles: per-layer costs on a device we do not have, from a roofline model.

    profile = estimate_profile(build_model("gpt1-14"), "v100", batch_size=8)

No real computation happens. Each layer is built on the meta device and run forward and backward
on meta tensors, once per micro-batch size of the grid, under a dispatch mode that records every
aten kernel the layer launches, with its FLOPs (torch's ``FlopCounterMode``) and the bytes of the
tensors it reads and writes. Views, detaches and bare allocations launch no kernel and are not
counted. A kernel with ``f`` FLOPs moving ``m`` bytes on a device model with per-kernel overhead
``o``, sustained peak ``P`` FLOP/s, memory bandwidth ``W`` B/s and saturation work ``s`` FLOPs
costs (a per-kernel roofline, after Williams, Waterman and Patterson, "Roofline", CACM 2009)::

    t = o + max(f / P, s / P_half, m / W)  for a kernel that does FLOPs (matmul, conv, attention)
    t = o + m / W                          for any other kernel (element-wise, norms, copies)

and a layer's forward (backward) device time is the sum over its forward (backward) kernels. ``P`` is the
peak of the profile's precision and ``P_half`` the device's half-precision peak (``peak_flops``), so
the floor ``s / P_half`` is a time that does not depend on the precision: it models under-use, a
matmul too small to fill the device running no faster than one of ``s`` half-precision FLOPs, which
gives the α + β·max(b, s) shape of docs/algorithms.md §2.2 (at fp32 ``s`` is reached at fewer
samples). Backward kernels are traced, not guessed: their FLOPs come out near 2× the forward's
(input and weight gradients), more for attention, which recomputes its scores.

Host dispatch. Eager PyTorch issues every kernel from the CPU: ``h`` seconds of framework dispatch
and launch call per kernel (``host_dispatch_s`` of the device model; 10 µs on the GPU models,
:data:`~pipetrain.cluster.DEVICE_MODELS` cites the range). The CPU runs ahead of the device, so the
two overlap; a pass (one layer's forward or backward, the loss's, a copy) of ``n`` kernels costs::

    T = max(Σ t, n · h)                    (:func:`pass_seconds`)

the device's time, unless the kernels are too small to hide their dispatch, when the device waits
for the host: a fixed cost per micro-batch, which small kernels (a launch-bound layer, small
micro-batches) pay. The CPU is not credited for running ahead across passes. ``o`` stays the
device's own cost per kernel.

Per-micro-batch costs beyond the layers, as a measured profile holds them (:mod:`.per_layer` times the
loss on the last layer): the **last layer** also pays the loss, its forward and backward kernels traced
on the last output as the layers are (the loss's backward joins the backward's B part, not W), and
the copy of the micro-batch's targets to the device; the **first layer** pays the copy of the
micro-batch's inputs. A copy of ``m`` bytes costs ``max(o + m / H, h)`` with ``H`` the host link's
bandwidth (``host_bandwidth_bytes_per_s``; none on ``cpu``, whose data is already in place). The
runtime copies a step's micro-batches when the step begins
(:meth:`~pipetrain.runtime.interp.context.RankContext.begin_step`); charging each copy to its
micro-batch's forward keeps the stage's total and puts it on the stage that pays it.

The split backward of method ``zb1`` (Qi et al. 2024) needs the weight-gradient part ``W`` of each
backward: at the grid's largest size the layer's backward is traced a second time with
``inputs=[x]`` (input gradients only, the kernels of ``B``); ``W``'s share there is the whole
backward's seconds minus ``B``'s, clamped at 0, and every grid size's backward is split at that
share (one extra trace per layer, which keeps estimation fast). A layer whose input takes no
gradient (an embedding's indices) puts its whole backward in ``W``. Where the restricted trace fails
the layer keeps the profile's default split (:data:`~pipetrain.profile.table.DEFAULT_WEIGHT_GRAD_SHARE`).

The optimizer's step is not traced: an estimated profile leaves ``step_s`` and ``optimizer_step_s``
empty, and the cost model prices each optimizer as its memory passes over the layer's parameter
bytes at ``W`` (:mod:`pipetrain.profile.optimizer_step`), with no per-tensor overhead ``o``: on a GPU,
torch's ``foreach`` optimizers step a stage's tensors in a few launches.

Attention (``scaled_dot_product_attention`` without a mask) is traced as torch's fused
memory-efficient kernel, as GPUs run it, instead of the unfused math path the meta device would
take, which would charge the ``[b, heads, T, T]`` score matrix to memory traffic.

A profile is estimated at a precision (:mod:`pipetrain.profile.precision`). At ``fp32`` the layer
runs in the model's own dtypes (float32 for the zoo) and FLOPs cost the device's float32 peak
(``P = fp32_peak_flops``: CUDA cores, not TF32; :data:`~pipetrain.cluster.DEVICE_MODELS`). At
``bf16`` or ``fp16`` the meta device has no autocast, so the layer is traced with its floating
parameters and inputs cast to the compute dtype: every kernel's bytes are the compute dtype's (half
of float32's) and its FLOPs cost the half-precision (tensor-core) peak of that dtype
(:func:`peak_flops`). Autocast keeps norms, softmax and reductions in float32; tracing them in the
compute dtype makes those memory-bound kernels up to 2x too cheap, while they are a small part of a
transformer's or a CNN's time. The parameter bytes stay float32 (the master weights, which the
optimizer updates); the casts of them that a micro-batch keeps (``cast_weight_bytes``) are the
weights of the layer's Linear, convolution and attention-projection modules in the compute dtype
(:func:`cast_weight_bytes`), which autocast casts and autograd saves; the loss is traced on a float32
output (autocast runs losses in float32), so its saved bytes are float32's. The casts themselves are
not traced (the traced weights are already in the compute dtype): each forward adds one memory-bound
kernel that reads those weights in float32 and writes them in the compute dtype, and each backward
one that casts their gradients back to float32 (:func:`_cast_kernel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from pipetrain.cluster import DeviceModel, device_model
from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import batch_norms
from pipetrain.graph.dataflow import layer_port, port_spec, profiled_layer
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.profile.inputs import (
    _scaled_loss,
    extrapolated_note,
    filled_below,
    loss_saved_bytes,
    model_loss_fn,
    size_grid,
    trainable_grid,
)
from pipetrain.profile.precision import Precision, compute_dtype
from pipetrain.profile.stats import layer_stats, tied_bytes
from pipetrain.profile.table import LayerProfile, Profile

__all__ = ["Kernel", "cast_weight_bytes", "estimate_profile", "kernel_seconds", "pass_seconds", "peak_flops",
           "trace_kernels"]

_aten = torch.ops.aten
# Ops that allocate or alias without launching a kernel (views are recognised by their schema).
_NO_KERNEL = frozenset(
    {
        _aten.detach,
        _aten.alias,
        _aten._unsafe_view,
        _aten.lift_fresh,
        _aten.empty,
        _aten.empty_like,
        _aten.empty_strided,
        _aten.new_empty,
        _aten.new_empty_strided,
    }
)
# Look-ups whose first argument is a table they read only the selected rows of.
_GATHERS = frozenset({_aten.embedding, _aten.index_select, _aten.gather, _aten.index})


@dataclass(frozen=True)
class Kernel:
    """One launched kernel: its FLOPs and the bytes of the tensors it reads and writes."""

    flops: float
    bytes_moved: float


def peak_flops(device: DeviceModel, precision: Precision = "fp32") -> float:
    """The sustained FLOP/s ``device`` runs matmuls at in ``precision`` (:class:`~pipetrain.cluster.DeviceModel`):
    its float32, bfloat16 or float16 (tensor-core) peak."""
    peaks = {"fp32": device.fp32_peak_flops, "bf16": device.bf16_peak_flops, "fp16": device.peak_flops}
    return peaks[precision] or device.peak_flops


def kernel_seconds(kernel: Kernel, device: DeviceModel, precision: Precision = "fp32") -> float:
    """Roofline seconds of one kernel on ``device`` (the formula in the module docstring), its FLOPs
    at ``precision``'s peak (:func:`peak_flops`)."""
    compute_s = 0.0
    if kernel.flops > 0:
        compute_s = max(kernel.flops / peak_flops(device, precision), device.saturation_flops / device.peak_flops)
    memory_s = kernel.bytes_moved / device.memory_bandwidth_bytes_per_s
    return device.kernel_overhead_s + max(compute_s, memory_s)


def pass_seconds(kernels: Sequence[Kernel], device: DeviceModel, precision: Precision = "fp32") -> float:
    """Seconds of a pass launching ``kernels``: their roofline seconds on the device, or the host's
    dispatch of them (``len(kernels) · host_dispatch_s``) when that is longer (module docstring)."""
    device_s = sum(kernel_seconds(k, device, precision) for k in kernels)
    return max(device_s, len(kernels) * device.host_dispatch_s)


def _copy_seconds(n_bytes: float, device: DeviceModel) -> float:
    """Seconds to copy ``n_bytes`` from the host to the device (0 where the host is the device)."""
    if device.host_bandwidth_bytes_per_s is None:
        return 0.0
    return max(device.kernel_overhead_s + n_bytes / device.host_bandwidth_bytes_per_s, device.host_dispatch_s)


def _tensor_bytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


class _KernelRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch is unannotated
    """Records a :class:`Kernel` per aten op that launches one; sits above a FlopCounterMode."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counter = counter
        self.kernels: list[Kernel] = []

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        before = self.counter.get_total_flops()
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if func.is_view or packet in _NO_KERNEL:
            return out
        if packet in _GATHERS:  # reads as many table bytes as it writes
            moved = _tensor_bytes(args[1:]) + _tensor_bytes(kwargs) + 2 * _tensor_bytes(out)
        else:
            moved = _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out)
        self.kernels.append(Kernel(self.counter.get_total_flops() - before, moved))
        return out


def _fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    out = _aten._scaled_dot_product_efficient_attention(
        query, key, value, None, query.requires_grad, dropout_p, is_causal, scale=scale
    )
    result: torch.Tensor = out[0]
    return result


class _FusedAttention(TorchFunctionMode):
    """Runs mask-free ``scaled_dot_product_attention`` as one fused kernel, as a GPU would."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is nn.functional.scaled_dot_product_attention and _fusable(args, kwargs):
            kwargs.pop("attn_mask", None)
            kwargs.pop("enable_gqa", None)
            return _fused_attention(*args, **kwargs)
        return func(*args, **kwargs)


def _fusable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True for ``sdpa(q, k, v, ...)`` without a mask (positional or keyword) or grouped heads."""
    return len(args) <= 3 and kwargs.get("attn_mask") is None and not kwargs.get("enable_gqa")


def _record(run: Callable[[], object]) -> tuple[Kernel, ...]:
    """The kernels launched by ``run()``."""
    with FlopCounterMode(display=False) as counter, _KernelRecorder(counter) as recorder:
        run()
    return tuple(recorder.kernels)


def trace_kernels(
    module: nn.Module, x: torch.Tensor, input_only: bool = False
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The forward and backward kernels of ``module`` (built on meta) on a meta ``x``; with
    ``input_only``, the backward's kernels for the input gradient alone (``inputs=[x]``; empty when
    ``x`` takes no gradient).

    The backward is that of the layer alone, for an output gradient of the output's shape; it is
    empty when nothing in the layer needs a gradient. Parameter gradients are accumulated into
    existing ``.grad`` tensors, as for every micro-batch but the first (and as measured).
    """
    x = x.detach().requires_grad_(x.is_floating_point())
    for p in module.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    outputs: list[torch.Tensor] = []
    with _FusedAttention(), torch.enable_grad():
        forward = _record(lambda: outputs.append(module(x)))
        out = outputs[0]
        if not out.requires_grad:
            return forward, ()
        grad = torch.empty_like(out)
        if input_only:
            backward = _record(lambda: torch.autograd.backward(out, grad, inputs=[x])) if x.requires_grad else ()
        else:
            backward = _record(lambda: torch.autograd.backward(out, grad))
    return forward, backward


_CAST_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                 nn.ConvTranspose3d)
"""Modules whose weight autocast casts to the compute dtype and autograd keeps for the input gradient."""


def cast_weight_bytes(module: nn.Module, precision: Precision) -> int:
    """Bytes of the compute-dtype casts of ``module``'s matmul and convolution weights (those of
    :data:`_CAST_MODULES` and ``nn.MultiheadAttention``'s input projection) that a micro-batch keeps
    under ``precision``'s autocast: 0 at fp32. Each weight counts once however often it is used."""
    if precision == "fp32":
        return 0
    weights = {id(m.weight): m.weight for m in module.modules() if isinstance(m, _CAST_MODULES)}
    weights |= {id(m.in_proj_weight): m.in_proj_weight for m in module.modules()
                if isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None}
    return sum(w.numel() for w in weights.values()) * compute_dtype(precision).itemsize


def _cast_kernel(cast_bytes: int, precision: Precision) -> Kernel:
    """The kernel casting weights of ``cast_bytes`` compute-dtype bytes from or to float32: it moves
    their bytes in both dtypes (module docstring)."""
    return Kernel(0.0, cast_bytes * (1 + 4 / compute_dtype(precision).itemsize))


def _meta_input(spec: TensorSpec, b: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A meta tensor ``[b, *spec.shape]`` of ``spec``'s dtype, or of ``dtype`` when it is floating."""
    floating = spec.torch_dtype.is_floating_point
    return torch.empty((b, *spec.shape), dtype=dtype if floating else spec.torch_dtype, device="meta")


def _estimate_layer(
    graph: LayerGraph, i: int, spec: TensorSpec, grid: tuple[int, ...], device: DeviceModel, smallest: int = 1,
    precision: Precision = "fp32",
) -> tuple[LayerProfile, TensorSpec]:
    """Layer ``i``'s estimated profile at ``precision``, given its input spec; and its output spec.
    Sizes below ``smallest`` (a BatchNorm that cannot train on them) are extrapolated (:func:`filled_below`)."""
    module = profiled_layer(graph, i, device="meta")
    master_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    casts = cast_weight_bytes(module, precision)
    dtype = compute_dtype(precision)
    module.to(dtype)  # floating parameters only; fp32 leaves the model's own dtypes
    forward_s, backward_s = [], []
    try:
        for b in grid:
            if b < smallest:
                continue
            forward, backward = trace_kernels(module, _meta_input(spec, b, dtype))
            if casts:
                cast = _cast_kernel(casts, precision)
                forward, backward = (*forward, cast), (*backward, cast)
            forward_s.append(pass_seconds(forward, device, precision))
            backward_s.append(pass_seconds(backward, device, precision))
        forward_s, backward_s = list(filled_below(grid, tuple(forward_s))), list(filled_below(grid, tuple(backward_s)))
        weight_grad_s = _weight_grad_s(module, _meta_input(spec, grid[-1], dtype), device, backward_s, precision)
        with _FusedAttention():
            stats, out = layer_stats(module, _meta_input(spec, grid[-1], dtype))
    except (NotImplementedError, RuntimeError) as e:
        raise UserError(
            f"layer {graph.layers[i].name!r} of {graph.name!r} cannot run on the meta device "
            f"({e}); measure its profile instead (measure_profile / `pipetrain profile`)"
        ) from None
    profile = LayerProfile(
        name=graph.layers[i].name,
        sizes=grid,
        forward_s=tuple(forward_s),
        backward_s=tuple(backward_s),
        output_bytes_per_sample=stats.output_bytes_per_sample,
        saved_bytes_per_sample=stats.saved_bytes_per_sample,
        parameter_bytes=master_bytes,
        flops_per_sample=stats.flops_per_sample,
        saved_input_bytes_per_sample=stats.saved_input_bytes_per_sample,
        saved_output_bytes_per_sample=stats.saved_output_bytes_per_sample,
        held_grad_bytes_per_sample=stats.held_grad_bytes_per_sample,
        weight_grad_s=weight_grad_s,
        cast_weight_bytes=casts,
    )
    return profile, TensorSpec.of(out)


def _weight_grad_s(module: nn.Module, x: torch.Tensor, device: DeviceModel, backward_s: Sequence[float],
                   precision: Precision) -> tuple[float, ...] | None:
    """Per grid size, the backward's seconds at the weight-gradient share traced on ``x`` (the grid's
    largest size; module docstring); None where the restricted trace fails (the default split then applies)."""
    try:
        kernels = trace_kernels(module, x, input_only=True)[1]
    except (NotImplementedError, RuntimeError):
        return None
    whole = backward_s[-1]
    share = max(0.0, whole - pass_seconds(kernels, device, precision)) / whole if whole > 0 else 0.0
    return tuple(share * b for b in backward_s)


def _loss_seconds(graph: LayerGraph, out: TensorSpec, grid: tuple[int, ...],
                  device: DeviceModel) -> tuple[list[float], list[float]]:
    """Per grid size, the forward and backward seconds of the model's loss on the last layer's output
    ``[b, *out.shape]`` (float32, as autocast runs losses), with :func:`pass_seconds`."""
    loss = model_loss_fn(graph)
    forward, backward = [], []
    for b in grid:
        y = _meta_input(out, b).requires_grad_(out.torch_dtype.is_floating_point)
        targets = _meta_input(graph.target, b)
        values: list[torch.Tensor] = []
        with torch.enable_grad():
            f = _record(lambda: values.append(_scaled_loss(loss, y, targets, grid[-1])))  # noqa: B023
            g = _record(lambda: torch.autograd.backward(values[0])) if values[0].requires_grad else ()  # noqa: B023
        forward.append(pass_seconds(f, device))
        backward.append(pass_seconds(g, device))
    return forward, backward


def _with_batch_costs(layers: list[LayerProfile], graph: LayerGraph, out: TensorSpec,
                      device: DeviceModel) -> list[LayerProfile]:
    """``layers`` with each micro-batch's data and loss costs (module docstring): the inputs' copy on
    the first layer's forward; the loss and the targets' copy on the last layer's passes."""
    grid = layers[0].sizes
    first = [_copy_seconds(b * graph.input.bytes_per_sample, device) for b in grid]
    loss_forward, loss_backward = _loss_seconds(graph, out, grid, device)
    targets = (_copy_seconds(b * graph.target.bytes_per_sample, device) for b in grid)
    last = [f + t for f, t in zip(loss_forward, targets, strict=True)]

    def plus(values: tuple[float, ...], extra: Sequence[float]) -> tuple[float, ...]:
        return tuple(v + e for v, e in zip(values, extra, strict=True))

    layers = [*layers]
    layers[0] = replace(layers[0], forward_s=plus(layers[0].forward_s, first))
    layers[-1] = replace(layers[-1], forward_s=plus(layers[-1].forward_s, last),
                         backward_s=plus(layers[-1].backward_s, loss_backward))
    return layers


def estimate_profile(
    graph: LayerGraph,
    device: str | DeviceModel,
    batch_size: int,
    *,
    sizes: Sequence[int] | None = None,
    precision: Precision = "fp32",
) -> Profile:
    """Estimate every layer's forward and backward seconds on a device model, at a precision.

    Args:
        graph: the model.
        device: a device model or its name in ``DEVICE_MODELS`` (``"v100"``, ``"h100"``, ...).
        batch_size: the mini-batch size B; the default grid is 1, 2, 4, … below B, and B.
        sizes: an explicit grid of micro-batch sizes instead.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (module docstring).

    Returns:
        A Profile like a measured one, with ``device`` the model's name.

    Raises:
        UserError: an unknown device model, a bad size, or a layer that cannot run on meta.
    """
    model = device if isinstance(device, DeviceModel) else device_model(device)
    norms = batch_norms(graph)
    grid = trainable_grid(graph.name, norms, size_grid(batch_size, sizes))
    layers, outputs = [], list[TensorSpec]()  # each layer's input from the earlier layers' outputs
    for i in range(len(graph)):
        smallest = 2 if graph.layers[i].name in norms.single_value else 1
        layer, out = _estimate_layer(graph, i, port_spec(graph, layer_port(graph, i), outputs), grid, model, smallest,
                                     precision)
        layers.append(layer)
        outputs.append(out)
    spec = outputs[-1]
    layers = _with_batch_costs(layers, graph, spec, model)
    source = (
        f"estimated for {model.name} at {precision}: per-kernel roofline, peak {peak_flops(model, precision):.3g} "
        f"FLOP/s, "
        f"{model.memory_bandwidth_bytes_per_s:.3g} B/s, {model.kernel_overhead_s * 1e6:.3g} us "
        f"per kernel, saturation {model.saturation_flops:.3g} FLOP, host dispatch "
        f"{model.host_dispatch_s * 1e6:.3g} us per kernel; loss on the last layer"
        f"{extrapolated_note(norms, grid)}"
    )
    return Profile(
        model=graph.name,
        fingerprint=graph.fingerprint(),
        device=model.name,
        source=source,
        input_bytes_per_sample=graph.input.bytes_per_sample,
        edges=() if graph.is_chain else tuple(graph.edges),
        ties=tied_bytes(graph),
        layers=tuple(layers),
        loss_saved_bytes_per_sample=loss_saved_bytes(
            graph, _meta_input(spec, grid[-1]), layers[-1].saved_output_bytes_per_sample > 0, torch.Generator()
        ),
        precision=precision,
    )
