"""One LSTM layer that launches the kernels a GPU runs, so estimated profiles can trace it.

    lstm = LSTM(inputs=1024, hidden=1024)
    hs = lstm(x)                       # x [b, T, inputs] float32 -> hs [b, T, hidden]

The cell is ``torch.nn.LSTM``'s (Hochreiter and Schmidhuber 1997, with the forget gate of Gers,
Schmidhuber and Cummins 2000), zero initial state, gates in the order i, f, g, o::

    [i, f, g, o] = x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh        [b, 4H]
    c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g),   h_t = σ(o) ⊙ tanh(c_t)

``reverse=True`` runs the recurrence from the last step to the first (the backward half of a
bidirectional layer); outputs stay in time order.

Why not ``torch.nn.LSTM``: on the meta device, where ``pipetrain.profile.estimate`` traces layers
(docs/algorithms.md §3.2, §4.2: per-layer forward and backward costs), ``nn.LSTM`` runs its unfused
per-step loop, 13 kernels per step forward and 24 backward. For one 1024-unit layer over 50
steps, estimating it on ``v100`` at batch 8 takes 3 s (about 50 s for the ``gnmt`` preset), and
with a launch charged to each of those small kernels it comes out at 6.0 ms forward and 17.7 ms
backward. This module takes 0.25 s and comes out at 1.7 ms and 2.2 ms: it has the kernel
structure of torch's CUDA ``LSTMCell`` (a GEMM and a fused element-wise kernel per step) with the
input projections and the weight gradient batched over all steps, as cuDNN does, and runs that
structure on every device:

* forward: one GEMM for the input projections of all T steps, then per step one GEMM
  ``h_{t-1} W_hhᵀ`` and one fused cell kernel (``aten._thnn_fused_lstm_cell``);
* backward (hand-written, :class:`_Recurrence`): per step one fused cell-backward kernel, one GEMM
  for the gradient flowing to ``h_{t-1}`` and one add, then one GEMM for ``∂W_hh`` over all steps
  and one reduction for the biases (autograd through a Python loop would instead add up T
  ``[4H, H]`` weight gradients, each moving 48 MiB at H = 1024: 60 µs on ``v100``, more than the
  step itself).

torch has the fused cell kernels for CUDA and the meta device only; on the CPU (and any other
device) the cell and its backward are the same formulas written with element-wise ops.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn

__all__ = ["LSTM"]

_aten = torch.ops.aten
_FUSED_DEVICES = frozenset({"cuda", "meta"})


def _cell(
    gates_x: torch.Tensor, gates_h: torch.Tensor, c: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step: ``(h_t, c_t, workspace)`` from pre-activation gates ``[b, 4H]`` and ``c_{t-1}`` ``[b, H]``.

    ``workspace`` ``[b, 4H]`` holds the activated gates σ(i), σ(f), tanh(g), σ(o), as the fused
    kernel's does; :func:`_cell_backward` reads it back.
    """
    if gates_x.device.type in _FUSED_DEVICES:
        h, c_next, workspace = _aten._thnn_fused_lstm_cell(gates_x, gates_h, c, b_ih, b_hh)
        return h, c_next, workspace
    i, f, g, o = (gates_x + gates_h + (b_ih + b_hh)).chunk(4, dim=1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c_next = f * c + i * g
    return o * torch.tanh(c_next), c_next, torch.cat((i, f, g, o), dim=1)


def _cell_backward(
    grad_h: torch.Tensor, grad_c: torch.Tensor, c_prev: torch.Tensor, c: torch.Tensor, workspace: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of one step's pre-activation gates ``[b, 4H]`` and of ``c_{t-1}`` ``[b, H]``.

    ``grad_h``, ``grad_c``: gradients of ``h_t`` and ``c_t``; ``c_prev``, ``c``: ``c_{t-1}``,
    ``c_t``; ``workspace``: from :func:`_cell`.
    """
    if grad_h.device.type in _FUSED_DEVICES:
        grad_gates, grad_c_prev, _ = _aten._thnn_fused_lstm_cell_backward_impl(
            grad_h, grad_c, c_prev, c, workspace, False
        )
        return grad_gates, grad_c_prev
    i, f, g, o = workspace.chunk(4, dim=1)
    tanh_c = torch.tanh(c)
    grad_c = grad_c + grad_h * o * (1 - tanh_c * tanh_c)
    grad_gates = torch.cat(
        (
            grad_c * g * i * (1 - i),
            grad_c * c_prev * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_h * tanh_c * o * (1 - o),
        ),
        dim=1,
    )
    return grad_gates, grad_c * f


class _Recurrence(torch.autograd.Function):
    """The recurrence over time: ``[T, b, 4H]`` input-projected gates → ``[T, b, H]`` outputs.

    Inputs: ``gates_x`` (``x_t W_ihᵀ`` for every step, time-major), ``w_hh`` ``[4H, H]``,
    ``b_ih`` and ``b_hh`` ``[4H]``, and ``reverse``. Saves every step's ``h``, ``c`` and workspace
    (``6·H`` floats per sample and step) for the backward.
    """

    @staticmethod
    def forward(
        ctx: Any, gates_x: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor, reverse: bool
    ) -> torch.Tensor:
        # One unbind, not a slice per step: the estimator traces every op, views included.
        steps_x = gates_x.unbind(0)
        w_hh_t = w_hh.t()
        h = gates_x.new_zeros(gates_x.shape[1], w_hh.shape[1])
        c = torch.zeros_like(h)
        hs, cs, workspaces = [], [], []
        for gates_x_t in reversed(steps_x) if reverse else steps_x:
            h, c, workspace = _cell(gates_x_t, torch.mm(h, w_hh_t), c, b_ih, b_hh)
            hs.append(h)
            cs.append(c)
            workspaces.append(workspace)
        if reverse:  # back to time order
            hs.reverse()
            cs.reverse()
            workspaces.reverse()
        h_all = torch.stack(hs)
        ctx.save_for_backward(h_all, torch.stack(cs), torch.stack(workspaces), w_hh)
        ctx.reverse = reverse
        return h_all

    @staticmethod
    def backward(
        ctx: Any, grad_hs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, None]:
        h_all, c_all, workspace_all, w_hh = ctx.saved_tensors
        reverse: bool = ctx.reverse
        steps = h_all.shape[0]
        zeros = torch.zeros_like(h_all[0])
        grads_h = grad_hs.contiguous().unbind(0)  # the fused kernels want each step's rows contiguous
        cs = c_all.unbind(0)
        workspaces = workspace_all.unbind(0)
        # The forward's steps in reverse; step t's predecessor is t + 1 when the forward ran reversed.
        order = range(steps) if reverse else range(steps - 1, -1, -1)
        before = 1 if reverse else -1
        grad_gates: list[torch.Tensor] = []
        grad_c = zeros
        for t in order:
            grad_h = grads_h[t] if not grad_gates else grads_h[t] + torch.mm(grad_gates[-1], w_hh)
            c_prev = cs[t + before] if 0 <= t + before < steps else zeros
            step_grad, grad_c = _cell_backward(grad_h, grad_c, c_prev, cs[t], workspaces[t])
            grad_gates.append(step_grad)
        if not reverse:  # back to time order
            grad_gates.reverse()
        grad_all = torch.stack(grad_gates)
        # h_{t-1} for every step t (zero before the first step of the forward's order).
        h_prev = torch.cat((h_all[1:], zeros[None])) if reverse else torch.cat((zeros[None], h_all[:-1]))
        grad_w_hh = torch.mm(grad_all.flatten(0, 1).t(), h_prev.flatten(0, 1))
        grad_bias = grad_all.sum(dim=(0, 1))
        return grad_all, grad_w_hh, grad_bias, grad_bias, None


class LSTM(nn.Module):
    """A single-direction LSTM layer: ``[b, T, inputs]`` → ``[b, T, hidden]``.

    Parameters have ``torch.nn.LSTM``'s names for one layer (``weight_ih_l0`` ``[4H, inputs]``,
    ``weight_hh_l0`` ``[4H, H]``, ``bias_ih_l0``, ``bias_hh_l0`` ``[4H]``), shapes and default
    initialisation (uniform in ±1/√H), so its state dict loads into ``nn.LSTM(inputs, hidden,
    batch_first=True)``: ``4H·(inputs + H) + 8H`` parameters.
    """

    def __init__(self, inputs: int, hidden: int, reverse: bool = False) -> None:
        super().__init__()
        self.reverse = reverse
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden, inputs))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden, hidden))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden))
        bound = 1 / math.sqrt(hidden)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates_x = torch.matmul(x.transpose(0, 1), self.weight_ih_l0.t())  # [T, b, 4H], one GEMM
        hs = _Recurrence.apply(  # type: ignore[no-untyped-call]  # torch is unannotated
            gates_x, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0, self.reverse
        )
        return cast(torch.Tensor, hs).transpose(0, 1)
