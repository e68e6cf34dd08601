"""Per-layer byte and FLOP counts from one recorded forward pass (what the profilers record beside time).

    stats, out = layer_stats(module, x)     # x [b, ...]; stats per sample; works on the meta device
    ties = tied_bytes(graph)                # the tied parameters' bytes (Profile.ties)

The saved bytes are what autograd keeps for backward (each storage once, parameters and buffers
excluded; the compute-dtype casts of parameters that autocast makes under mixed precision,
:func:`~pipetrain.profile.autocast.is_parameter_cast`, are counted apart, per micro-batch), counted
by a ``saved_tensors_hooks`` pack hook; the held-gradient bytes are those a split backward's B
keeps for its W (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"; one gradient per parameter owner's output,
:mod:`pipetrain.graph.split_backward`), counted by running that B once; FLOPs are
``FlopCounterMode``'s, with the CPU attention kernel added (PipeDream's profiler records activation
sizes and compute per layer, Narayanan et al. SOSP'19 §3.2; UMPIPE's cost model needs the same,
docs/algorithms.md §2.6).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import FlopCounterMode

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.split_backward import input_grads, layer_outputs
from pipetrain.profile.autocast import is_parameter_cast, message_bytes
from pipetrain.profile.table import TiedBytes

__all__ = ["LayerStats", "SavedStorages", "held_grad_bytes", "layer_stats", "tied_bytes"]


@dataclass(frozen=True)
class LayerStats:
    """Per-sample sizes of one layer, from one forward pass.

    Attributes:
        flops_per_sample: forward FLOPs (a multiply-add counts 2), as FlopCounterMode counts them.
        saved_bytes_per_sample: bytes of the storages autograd saves for backward, each storage
            once, parameters, buffers and their autocast casts excluded (the layer's input is counted
            when saved).
        output_bytes_per_sample: bytes of the output as a message (in the compute dtype under
            autocast, :func:`~pipetrain.profile.autocast.message_bytes`).
        parameter_bytes: bytes of all parameters (not per sample).
        saved_input_bytes_per_sample: of the saved bytes, the input's (0 when not saved).
        saved_output_bytes_per_sample: of the saved bytes, the output's (0 when not saved).
        held_grad_bytes_per_sample: bytes a split backward's B keeps until W: the gradients of the
            parameter owners' outputs (:func:`held_grad_bytes`; 0 without parameters).
        cast_weight_bytes: bytes of autocast's casts of the parameters that autograd saves (not
            per sample; 0 without autocast).
    """

    flops_per_sample: float
    saved_bytes_per_sample: int
    output_bytes_per_sample: int
    parameter_bytes: int
    saved_input_bytes_per_sample: int
    saved_output_bytes_per_sample: int
    held_grad_bytes_per_sample: int
    cast_weight_bytes: int = 0


def _attention_flops(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """``softmax(q kᵀ) v`` as two batched matmuls, ``2·n·T_q·T_k·(d_qk + d_v)`` FLOPs.

    ``n`` is the product of the leading (batch, head) dimensions. The causal mask is ignored, as
    torch's own formulas for the CUDA attention kernels ignore it.
    """
    n = 1
    for d in query_shape[:-2]:
        n *= d
    return 2 * n * query_shape[-2] * key_shape[-2] * (query_shape[-1] + value_shape[-1])


# torch's FlopCounterMode knows the CUDA attention kernels but not the CPU one.
_EXTRA_FLOP_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
}


# Equal for tensors that share a storage, on every device (data pointers are all 0 on "meta").
# Typed here because torch leaves StorageWeakRef unannotated.
_storage_key: Callable[[torch.UntypedStorage], Hashable] = StorageWeakRef


class SavedStorages:
    """A ``saved_tensors_hooks`` pack hook that adds up the bytes of distinct saved storages, but
    those of the module's parameters and buffers; autocast's casts of its parameters apart."""

    def __init__(self, module: nn.Module) -> None:
        owned = [*module.parameters(), *module.buffers()]
        self.excluded = {_storage_key(t.untyped_storage()) for t in owned}
        self.parameters = frozenset(id(p) for p in module.parameters())
        self.seen: dict[Hashable, torch.Tensor] = {}
        self.casts: dict[Hashable, torch.Tensor] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor.untyped_storage())
        if key not in self.excluded:  # holding the tensor keeps its storage (and key) alive
            (self.casts if is_parameter_cast(tensor, self.parameters) else self.seen)[key] = tensor
        return tensor

    @property
    def total_bytes(self) -> int:
        """Bytes of the saved storages but the parameters' casts."""
        return sum(int(t.untyped_storage().nbytes()) for t in self.seen.values())

    @property
    def cast_bytes(self) -> int:
        """Bytes of the saved casts of the parameters (autocast's)."""
        return sum(int(t.untyped_storage().nbytes()) for t in self.casts.values())

    def bytes_of(self, tensor: torch.Tensor) -> int:
        """The bytes of ``tensor``'s storage if it was saved, else 0."""
        return int(tensor.untyped_storage().nbytes()) if _storage_key(tensor.untyped_storage()) in self.seen else 0


def layer_stats(module: nn.Module, x: torch.Tensor) -> tuple[LayerStats, torch.Tensor]:
    """Count one layer's FLOPs and bytes with one recorded forward on ``x`` (``[b, …]``).

    Works on any device, the meta device included. Returns the stats and the output (with its
    autograd graph, so ``output.requires_grad`` tells whether the layer has a backward).
    """
    b = x.shape[0]
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    saved = SavedStorages(module)
    counter = FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS)
    with torch.enable_grad(), counter, torch.autograd.graph.saved_tensors_hooks(
        saved.pack, lambda t: t
    ):
        out = module(x)
    stats = LayerStats(
        flops_per_sample=counter.get_total_flops() / b,
        saved_bytes_per_sample=saved.total_bytes // b,
        output_bytes_per_sample=message_bytes(out) // b,
        parameter_bytes=sum(p.numel() * p.element_size() for p in module.parameters()),
        saved_input_bytes_per_sample=saved.bytes_of(x) // b,
        saved_output_bytes_per_sample=saved.bytes_of(out) // b,
        held_grad_bytes_per_sample=held_grad_bytes(module, x) // b,
        cast_weight_bytes=saved.cast_bytes,
    )
    return stats, out


def held_grad_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of what a split backward's B keeps for W on ``x`` (``[b, …]``): the distinct storages of
    the gradients of every parameter owner's output (``g_i [b, *out_i]``, as the runtime's B returns
    them; the whole output's gradient where the per-owner W falls back), 0 for a layer without
    parameters or without a backward. Runs the layer's forward and its B once, on any device (the
    meta device included, where it counts shapes)."""
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    with torch.enable_grad():
        y, record = layer_outputs(module, x)
        if not y.requires_grad:
            return 0
        work = input_grads(y, torch.zeros_like(y), x, record)[1]
    storages = {_storage_key(g.untyped_storage()): g for _, g in work}
    return sum(int(g.untyped_storage().nbytes()) for g in storages.values())


def tied_bytes(graph: LayerGraph) -> tuple[TiedBytes, ...]:
    """The graph's tied parameters (persistent buffers left out: no gradient to sum) and their bytes,
    read from their first layer built on the meta device."""
    out = []
    for tie in graph.ties:
        i = graph.index(tie.layers[0])
        layer = graph.layers[i]
        held = [p for k, p in graph.build_layer(i, device="meta").named_parameters(remove_duplicate=False)
                if layer.qualified(k) in tie.names]
        if held:
            out.append(TiedBytes(tie.layers, held[0].numel() * held[0].element_size()))
    return tuple(out)
