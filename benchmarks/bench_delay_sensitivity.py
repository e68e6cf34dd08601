"""Is 2BW's convergence gap on gpt-tiny the method's delay, or pipetrain? A single-process answer.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_delay_sensitivity.py --out benchmarks/results/delay-sensitivity
    PYTHONPATH=. .venv/bin/python benchmarks/bench_delay_sensitivity.py --quick --out /tmp/delay   # smoke run

PipeDream-2BW (Narayanan et al., ICML'21) updates ``W(t+1) = W(t) − ν·∇f(W(t−1))``: every stage applies
a gradient computed one version late. This script trains ``gpt-tiny`` on ``text`` in one process with
plain ``torch.optim.AdamW`` and *no pipeline at all*, computing batch ``t``'s gradient at the weights
of ``d`` steps before (``d = 0``: ordinary training, what ``1f1b`` equals; ``d = 1``: 2BW's semantics),
in the setting of ``bench_async_convergence.py`` (batch 32, 300 batches, ``lr 3e-3``, linear warm-up
over 5 % of the steps then cosine to 0), over three seeds (the seed draws the initial weights and the
batches). Variants of ``d = 1`` that a rule could apply:

* ``lr ×f``: the peak rate scaled by ``f``;
* ``sync warm-up N``: the first ``N`` batches without delay (a pipeline drained after every batch,
  as PipeMare's synchronous warm-up epochs), then ``d = 1``;
* ``weight prediction``: the gradient taken at ``W(t−1)`` moved one Adam step ahead,
  ``W(t−1) − ν·m̂/(√v̂ + ε)`` from the optimizer's moments (XPipe's prediction), which estimates the
  ``W(t)`` it is applied to;
* ``β1``, ``β2``: AdamW's moment decays (asynchrony acts as extra momentum, Mitliagkas et al. 2016);
* ``delay compensation λ``: DC-ASGD's first-order correction of the stale gradient (Zheng et al.,
  ICML'17), ``g + λ·g⊙g⊙(W(t) − W(t−1))/√v̂``, normalised by Adam's second moment as DC-ASGD-a is.

Output under ``--out``: ``runs.json`` (every run), ``table.md`` (eval loss and accuracy per variant:
median over seeds, and each seed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from pipetrain.data.loss import model_loss
from pipetrain.fileio import write_atomic
from pipetrain.graph.dataflow import chain_stage
from pipetrain.graph.zoo import build_model
from pipetrain.runtime.job.data import timed_batch
from pipetrain.runtime.job.evaluate import eval_dataset, evaluate_module

BATCH, LR = 32, 3e-3
Weights = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Variant:
    """One way to train: a gradient delay and what a rule could do about it."""

    label: str
    delay: int
    lr_factor: float = 1.0
    sync_warmup: int = 0
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


def predicted(model: nn.Module, opt: torch.optim.AdamW, lr: float) -> Weights:
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


def compensate(model: nn.Module, opt: torch.optim.AdamW, newest: Weights, stale: Weights, lam: float) -> None:
    """DC-ASGD-a: ``g += λ·g⊙g⊙(newest − stale)/√v̂`` on every gradient (Adam's ``v̂``; none before step 1)."""
    beta2 = opt.param_groups[0]["betas"][1]
    for name, p in model.named_parameters():
        state = opt.state.get(p)
        if state and p.grad is not None:
            v = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
            p.grad += lam * p.grad * p.grad / (v.sqrt() + 1e-8) * (newest[name] - stale[name])


def load(model: nn.Module, weights: Weights) -> None:
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
        load(model, stale)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(batch.inputs), batch.targets).backward()
        load(model, master)  # the gradient, taken at the old version, steps the newest one
        if variant.compensation and delay:
            compensate(model, opt, master, stale, variant.compensation)
        for group in opt.param_groups:
            group["lr"] = lr_of(t)
        opt.step()
        newest = predicted(model, opt, lr_of(t + 1)) if variant.predict else {
            n: p.detach().clone() for n, p in model.named_parameters()}
        versions = [*versions[-1:], newest]
    result = evaluate_module(model, loss_fn, eval_dataset("text", graph), BATCH)
    return {"eval_loss": result.loss, "eval_accuracy": result.accuracy}


def table(runs: list[dict[str, object]], seeds: list[int]) -> str:
    head = "| variant | eval accuracy (median) | eval loss (median) | " + " | ".join(
        f"seed {s}: acc / loss" for s in seeds) + " |"
    lines = [head, "|---" * (3 + len(seeds)) + "|"]
    for v in VARIANTS:
        rows = {int(str(r["seed"])): r for r in runs if r["label"] == v.label}
        if not rows:
            continue
        acc = statistics.median(float(str(r["eval_accuracy"])) for r in rows.values())
        loss = statistics.median(float(str(r["eval_loss"])) for r in rows.values())
        cells = [f"{float(str(rows[s]['eval_accuracy'])):.1%} / {float(str(rows[s]['eval_loss'])):.3f}"
                 for s in seeds]
        lines.append(f"| {v.label} | {acc:.1%} | {loss:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", metavar="LABEL", help="train only the variants of these labels")
    parser.add_argument("--quick", action="store_true", help="20 batches, one seed, three variants")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps, seeds, variants = args.steps, args.seeds, VARIANTS
    if args.quick:
        steps, seeds, variants = 20, [0], VARIANTS[:2] + VARIANTS[-2:]
    if args.only:
        variants = tuple(v for v in variants if v.label in args.only)
    runs: list[dict[str, object]] = []
    for v in variants:
        for seed in seeds:
            row = {"label": v.label, "seed": seed, "steps": steps, **asdict(v), **train(v, seed, steps)}
            print(json.dumps(row), flush=True)
            runs.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "runs.json", json.dumps(runs, indent=1))
    write_atomic(args.out / "table.md", table(runs, seeds))
    print(table(runs, seeds))


if __name__ == "__main__":
    main()
