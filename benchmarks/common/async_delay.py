"""Training gpt-tiny in one process with a gradient delay, and what a rule could do about it.

Batch ``t``'s gradient is taken at the weights of ``d`` steps before and applied to the newest ones
(``d = 0``: ordinary training, what ``1f1b`` equals; ``d = 1``: PipeDream-2BW's
``W(t+1) = W(t) − ν·∇f(W(t−1))``), with plain ``torch.optim.AdamW`` and no pipeline at all. The
variants (:data:`VARIANTS`) are what a rule could apply; delay-sensitivity's docstring describes each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.data.loss import model_loss
from pipetrain.graph.dataflow import chain_stage
from pipetrain.graph.zoo import build_model
from pipetrain.runtime.job.data import timed_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_module

__all__ = ["BATCH", "LR", "VARIANTS", "Variant", "train"]

BATCH, LR = 32, 3e-3
Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Variant:
    """One way to train: a gradient delay and what a rule could do about it."""

    label: str
    delay: int
    lr_factor: float = 1.0
    sync_warmup: int = 0  # the first steps // sync_warmup batches without delay (0: none)
    predict: bool = False
    compensation: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)


VARIANTS = (
    Variant("d=0 (1f1b's semantics)", 0),
    Variant("d=1 (2BW's semantics)", 1),
    Variant("d=1, lr ×1/2", 1, lr_factor=0.5),
    Variant("d=1, lr ×1/4", 1, lr_factor=0.25),
    Variant("d=1, lr ×1/10", 1, lr_factor=0.1),
    Variant("d=0, lr ×1/10", 0, lr_factor=0.1),
    Variant("d=1, sync warm-up 1/5 of the run", 1, sync_warmup=5),
    Variant("d=1, sync warm-up 1/3 of the run", 1, sync_warmup=3),
    Variant("d=1, weight prediction", 1, predict=True),
    Variant("d=1, delay compensation λ=30", 1, compensation=30.0),
    Variant("d=1, β1 = 0.7", 1, betas=(0.7, 0.999)),
    Variant("d=1, β1 = 0.95", 1, betas=(0.95, 0.999)),
    Variant("d=1, β2 = 0.95", 1, betas=(0.9, 0.95)),
)


def rate(t: int, steps: int, peak: float) -> float:
    """Linear warm-up over 5 % of the steps, then cosine to 0 (the runtime's ``warmup-cosine``)."""
    warm = max(1, steps // 20)
    if t < warm:
        return peak * (t + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (t - warm) / max(1, steps - warm)))


def _predicted(model: nn.Module, opt: torch.optim.AdamW, lr: float) -> Weights:
    """The weights one AdamW step ahead of ``model``'s, from the optimizer's moments (XPipe)."""
    group = opt.param_groups[0]
    beta1, beta2 = group["betas"]
    out: Weights = {}
    for name, p in model.named_parameters():
        state = opt.state.get(p)
        w = p.detach().clone()
        if state:
            n = float(state["step"])
            m, v = state["exp_avg"] / (1 - beta1**n), state["exp_avg_sq"] / (1 - beta2**n)
            w -= lr * (m / (v.sqrt() + group["eps"]) + group["weight_decay"] * w)
        out[name] = w
    return out


def _compensate(model: nn.Module, opt: torch.optim.AdamW, newest: Weights, stale: Weights, lam: float) -> None:
    """DC-ASGD-a: ``g += λ·g⊙g⊙(newest − stale)/√v̂`` on every gradient (Adam's ``v̂``; none before step 1)."""
    beta2 = opt.param_groups[0]["betas"][1]
    for name, p in model.named_parameters():
        state = opt.state.get(p)
        if state and p.grad is not None:
            v = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
            p.grad += lam * p.grad * p.grad / (v.sqrt() + 1e-8) * (newest[name] - stale[name])


def _load(model: nn.Module, weights: Weights) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])


def train(variant: Variant, seed: int, steps: int) -> dict[str, float]:
    """``steps`` batches of ``variant``; the eval loss and accuracy after them."""
    torch.manual_seed(seed)
    graph = build_model("gpt-tiny")
    model = chain_stage(graph, list(range(len(graph.layers))))
    loss_fn = model_loss(graph.loss)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=variant.betas)
    sync_until = steps // variant.sync_warmup if variant.sync_warmup else 0
    peak = LR * variant.lr_factor
    lr_of: Callable[[int], float] = lambda t: rate(t, steps, LR if t < sync_until else peak)  # noqa: E731
    versions: list[Weights] = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    for t in range(steps):
        batch = timed_batch(graph, BATCH, t, seed, "text")
        master = {n: p.detach().clone() for n, p in model.named_parameters()}
        delay = 0 if t < sync_until else variant.delay
        stale = versions[max(0, len(versions) - 1 - delay)] if delay else master
        _load(model, stale)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(batch.inputs), batch.targets).backward()
        _load(model, master)  # the gradient, taken at the old version, steps the newest one
        if variant.compensation and delay:
            _compensate(model, opt, master, stale, variant.compensation)
        for group in opt.param_groups:
            group["lr"] = lr_of(t)
        opt.step()
        newest = _predicted(model, opt, lr_of(t + 1)) if variant.predict else {
            n: p.detach().clone() for n, p in model.named_parameters()}
        versions = [*versions[-1:], newest]
    result = evaluate_module(model, loss_fn, eval_dataset("text", graph), BATCH)
    return {"eval_loss": result.loss, "eval_accuracy": result.accuracy}
