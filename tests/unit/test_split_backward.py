"""The split backward (B, then W per parameter owner) gives the gradients of one ordinary backward."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipetrain.graph.dataflow import profiled_layer
from pipetrain.graph.split_backward import input_grads, layer_outputs, weight_grads
from pipetrain.graph.zoo import build_model
from pipetrain.profile.inputs import sample_input

Grads = tuple[list[torch.Tensor], torch.Tensor | None, bool]


def _gradients(module: nn.Module, x: torch.Tensor, grad: torch.Tensor, split: bool) -> Grads:
    """Parameter gradients, the input's gradient, and whether the per-owner split was exact."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(x.is_floating_point())
    exact = False
    if split:
        y, record = layer_outputs(module, x)
        exact = record.exact()
        x_grad, work = input_grads(y, grad, x, record)
        weight_grads(work)
    else:
        torch.autograd.backward(module(x), grad)
        x_grad = x.grad
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in module.parameters()], x_grad, exact


def _assert_same(module: nn.Module, x: torch.Tensor) -> bool:
    grad = torch.randn_like(module(x).float())
    ref, ref_x, _ = _gradients(module, x, grad, split=False)
    got, got_x, exact = _gradients(module, x, grad, split=True)
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    if ref_x is not None:
        assert got_x is not None
        torch.testing.assert_close(got_x, ref_x, rtol=1e-5, atol=1e-6)
    return exact


class _Tied(nn.Module):
    """One linear called twice: not exact per owner, so W re-walks the stage."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(torch.relu(self.lin(x)))
        return out


class _Nested(nn.Module):
    """An owner (``scale``) whose own weight is reached through a child owner."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x * self.scale)
        return out


class _InPlace(nn.Module):
    """A recorded output changed in place: the split falls back to the whole stage."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.mul_(2.0)
        out: torch.Tensor = self.b(h)
        return out


@pytest.mark.parametrize(("module", "exact"), [
    (_Tied(), False),
    (_Nested(), True),
    (_InPlace(), False),
    (nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8)), False),
    (nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 8, bias=False)), True),
])
def test_split_equals_one_backward(module: nn.Module, exact: bool) -> None:
    torch.manual_seed(0)
    assert _assert_same(module, torch.randn(4, 3, 8)) is exact


@pytest.mark.parametrize("model", ["gpt-tiny", "mlp"])
def test_zoo_stages_split_exactly(model: str) -> None:
    graph = build_model(model)
    x = sample_input(graph.input, 4, torch.device("cpu"), torch.Generator().manual_seed(0))
    stage = nn.Sequential(*[profiled_layer(graph, i, torch.device("cpu")) for i in range(len(graph))])
    assert _assert_same(stage, x)


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(1, 6), min_size=2, max_size=5), tie=st.booleans(), seed=st.integers(0, 99))
def test_random_stacks(widths: list[int], tie: bool, seed: int) -> None:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(a, b) for a, b in itertools.pairwise(widths)]
    if tie:
        layers += [nn.Linear(widths[-1], widths[0]), layers[0]]  # the first weights used twice
    assert _assert_same(nn.Sequential(*layers), torch.randn(3, widths[0])) is not tie


def _hooked(module: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in module.modules())


def test_kept_hooks_record_every_call_and_only_inside() -> None:
    """The runtime's kept hooks: each recorded forward sees its own owner calls, a plain call records
    nothing, a parameter frozen after the hooks were registered is left out, and the split stays exact."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    first = layer_outputs(module, x, keep_hooks=True)[1]
    hooks = _hooked(module)
    assert hooks == 3
    module(x)  # a plain call between recordings records nothing into either
    second = layer_outputs(module, x, keep_hooks=True)[1]
    assert _hooked(module) == hooks  # registered once
    assert len(first.owners) == len(second.owners) == 3 and first.exact() and second.exact()
    assert {id(o.output) for o in first.owners}.isdisjoint(id(o.output) for o in second.owners)
    module[1].weight.requires_grad_(False)
    frozen = layer_outputs(module, x, keep_hooks=True)[1]
    assert [len(o.params) for o in frozen.owners] == [2, 1, 2] and frozen.exact()


def test_transient_recording_leaves_no_hooks() -> None:
    """The profiler's recording removes its hooks, so its timed plain forwards run without them."""
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    layer_outputs(module, torch.randn(2, 4))
    assert _hooked(module) == 0


def test_a_module_frozen_after_its_hooks_were_kept_is_no_owner() -> None:
    module = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    layer_outputs(module, x, keep_hooks=True)
    module[1].requires_grad_(False)
    frozen = layer_outputs(module, x, keep_hooks=True)[1]
    assert [o.output.shape[-1] for o in frozen.owners] == [8, 3] and frozen.exact()


class _Ops(TorchDispatchMode):
    """Records the aten ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def test_later_micro_batches_accumulate_a_linear_weight_in_place() -> None:
    """W of a plain linear on a second micro-batch adds ``gᵀ a`` into the existing ``.grad`` with one
    ``addmm_`` (no product of the weight's size apart, no separate add), and the sum is the two
    micro-batches' gradients of one ordinary backward each."""
    torch.manual_seed(0)
    module = nn.Linear(6, 4)
    xs, gs = torch.randn(2, 3, 6), torch.randn(2, 3, 4)
    expected = [torch.zeros_like(p) for p in module.parameters()]
    for x, g in zip(xs, gs, strict=True):
        module.zero_grad(set_to_none=True)
        torch.autograd.backward(module(x), g)
        expected = [e + p.grad for e, p in zip(expected, module.parameters(), strict=True)]
    module.zero_grad(set_to_none=True)
    for i, (x, g) in enumerate(zip(xs, gs, strict=True)):
        y, record = layer_outputs(module, x)
        work = input_grads(y, g, x, record)[1]
        grads_before = [p.grad for p in module.parameters()]
        with _Ops() as seen:
            weight_grads(work)
        if i == 1:
            assert "addmm_" in seen.ops and "mm" not in seen.ops, seen.ops
            assert all(p.grad is before for p, before in zip(module.parameters(), grads_before, strict=True))
    for e, p in zip(expected, module.parameters(), strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-5, atol=1e-6)
