"""The single-process emulator of the asynchronous methods: the reference their runtime must equal.

docs/algorithms.md §3.5: a staleness bug (a backward on the wrong weights, a step in the wrong
order) changes no shape and raises nothing, so :func:`emulate_async` trains the model in one
process from the methods' *definitions*, not from the schedule, and the multi-process runs are
compared with it. Micro-batch ``j`` (0-based over the run; batch ``t = ⌊j/m⌋``) runs forward and
backward on every stage ``k`` with version ``v(k, j)`` of that stage's weights (its weights after
``v`` steps):

- ``pipedream`` (Narayanan et al. 2019): stage ``k`` on ``r`` replicas keeps ``n_k`` micro-batches in
  flight, the largest of ``r_i·((R−1−before_i)//r_i + 1)`` over stages ``i >= k`` (PipeDream's
  warm-up, ``R`` ranks in all, ``before_i`` upstream of ``i``), so ``v(k, j) = 0`` for ``j < n_k``,
  else ``⌊(j−n_k)/r⌋ + 1``; step ``s`` sums the gradients of micro-batches ``s·r … s·r + r − 1``,
  each loss divided by its micro-batch's size;
- ``pipedream`` with vertical sync: ``v(k, j) = v(0, j)`` on every stage;
- ``2bw`` (Narayanan et al. 2021): ``v(k, j) = max(t − 1, 0)``; step ``t`` sums batch ``t``'s gradients, losses divided
  by the batch size ``B``, whichever replica of a replicated stage ran them (the paper's ``w``
  parallel pipelines all-reduce them), so replicas change nothing here.

With ``clip_grad_norm`` (docs/algorithms.md §3.5) a step's gradient ``g`` is scaled by
``min(1, max_norm / (‖·‖ + 1e-6))`` before the optimizer: under ``pipedream`` ``‖g‖`` over the stage's
parameters (each update is a mini-batch of its own), under ``2bw`` the norm of batch ``t``'s gradient
over every stage's parameters, as single-process training clips a batch.

A run that checkpoints drains its pipeline before each of its ``drains`` (batch indices;
:mod:`pipetrain.schedule.segments`): each segment starts the method's delay afresh, as a new run
would, from the versions the stages reached. Micro-batch ``j`` of batch ``t`` in the segment that
starts at batch ``a`` uses ``s(k, a) + v(k, j − a·m)``, ``s(k, a) = a·m/g`` being the steps stage
``k`` took before ``a`` (``g`` micro-batches per step: ``m`` for ``2bw``, ``r`` for ``pipedream``);
so ``2bw``'s batch ``t`` uses ``max(t − 1, a)``.

Versions are computed lazily and in step order, each with the stage's own optimizer (its state
advances once per step) at the runtime's rate: the base rate times the stage's factor under the
configured ``lr_rule`` (:mod:`pipetrain.runtime.job.lr_rule`). The learning rate must be constant (the
runtime sets it per batch while a stage's steps straddle batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.func import functional_call

from pipetrain.errors import UserError
from pipetrain.graph.dataflow import chain_stage
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.runtime.job.config import TrainConfig, TrainJob, job_loss
from pipetrain.runtime.job.data import timed_batch
from pipetrain.runtime.job.optim import CLIP_EPS, set_lr

__all__ = ["emulate_async", "microbatch_version", "step_group"]

Weights = dict[str, torch.Tensor]


def _in_flight(plan: Plan, stage: int) -> int:
    """``n_k``: PipeDream's warm-up over the stage's replicas, at least what the next stage holds
    (a stage cannot get a gradient back before its successor's first backward)."""
    bounds, before = [], 0
    for s in plan.stages:
        r = len(s.ranks)
        bounds.append(r * ((plan.n_ranks - 1 - before) // r + 1))
        before += r
    return max(bounds[stage:])


def microbatch_version(plan: Plan, stage: int, j: int, drains: Sequence[int] = ()) -> int:
    """``v(stage, j)``: the version micro-batch ``j`` of the run uses on ``stage``, the pipeline
    drained before each batch of ``drains`` (module docstring)."""
    m = len(plan.stages[0].forward_sizes)
    start = max((d for d in drains if d <= j // m), default=0)
    j -= start * m
    before = start * m // len(step_group(plan, stage, 0))  # the steps the stage took before the segment
    if plan.weights is WeightPolicy.TWO_BW:
        return before + max(j // m - 1, 0)
    if plan.weights is WeightPolicy.VERTICAL_SYNC:
        stage = 0
    n, r = _in_flight(plan, stage), len(plan.stages[stage].ranks)
    return before + (0 if j < n else (j - n) // r + 1)


def step_group(plan: Plan, stage: int, step: int) -> range:
    """The micro-batches (of the run) whose gradients ``stage``'s step ``step`` sums."""
    size = len(plan.stages[0].forward_sizes) if plan.weights is WeightPolicy.TWO_BW else len(plan.stages[stage].ranks)
    return range(step * size, (step + 1) * size)


class _Emulator:
    def __init__(self, graph: LayerGraph, plan: Plan, config: TrainConfig, drains: Sequence[int]) -> None:
        self.graph, self.plan, self.config, self.drains = graph, plan, config, drains
        self.modules = [chain_stage(graph, [graph.index(n) for n in s.layers]) for s in plan.stages]
        self.optimizers = [config.build_optimizer(m.parameters()) for m in self.modules]
        self.params = [dict(m.named_parameters()) for m in self.modules]
        for optimizer, scale in zip(self.optimizers, config.stage_rates(plan).scales, strict=True):
            set_lr(optimizer, config.lr * scale)  # the runtime's rate (constant schedule)
        self.versions: list[list[Weights]] = [[self._snapshot(k)] for k in range(plan.n_stages)]
        self.grads: dict[int, list[Weights]] = {}
        self.loss = job_loss(TrainJob(graph, plan, config))
        self.batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _snapshot(self, k: int) -> Weights:
        return {n: p.detach().clone() for n, p in self.modules[k].named_parameters()}

    def version(self, k: int, v: int) -> Weights:
        while len(self.versions[k]) <= v:
            self._advance(k)
        return self.versions[k][v]

    def _advance(self, k: int) -> None:
        """Stage ``k``'s next step: the summed gradients of its group, clipped, through its optimizer."""
        step = len(self.versions[k]) - 1
        scale = self._clip_scale(k, step)
        for name, grad in self._step_gradient(k, step).items():
            self.params[k][name].grad = grad * scale
        self.optimizers[k].step()
        self.optimizers[k].zero_grad(set_to_none=True)
        self.versions[k].append(self._snapshot(k))

    def _step_gradient(self, k: int, step: int) -> Weights:
        """The gradient stage ``k``'s step ``step`` applies: the sum over its group's micro-batches."""
        group = step_group(self.plan, k, step)
        return {name: torch.stack([self.gradient(j)[k][name] for j in group]).sum(0) for name in self.params[k]}

    def _clip_scale(self, k: int, step: int) -> torch.Tensor:
        """``min(1, max_norm / (norm + 1e-6))`` for stage ``k``'s step ``step`` (1 without clipping):
        the norm of the update itself under ``pipedream`` (each update a mini-batch of its own), the
        norm of the batch's gradient over every stage under ``2bw``."""
        max_norm = self.config.clip_grad_norm
        if max_norm is None:
            return torch.ones(())
        stages = [k] if self.plan.spec.loss_per_microbatch else range(self.plan.n_stages)
        grads = [g for i in stages for g in self._step_gradient(i, step).values()]
        squared = torch.stack([torch.linalg.vector_norm(g, 2.0).double().square() for g in grads]).sum()
        total = squared.sqrt().float()
        return torch.clamp(max_norm / (total + CLIP_EPS), max=1.0)

    def _batch(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        if t not in self.batches:
            batch = timed_batch(self.graph, self.plan.batch_size, t, self.config.seed, self.config.data)
            self.batches[t] = (batch.inputs, batch.targets)
        return self.batches[t]

    def gradient(self, j: int) -> list[Weights]:
        """Per stage, micro-batch ``j``'s weight gradients on its versions (memoised)."""
        if j not in self.grads:
            self.grads[j] = self._compute_gradient(j)
        return self.grads[j]

    def _compute_gradient(self, j: int) -> list[Weights]:
        sizes = self.plan.stages[0].forward_sizes
        t, i = divmod(j, len(sizes))
        lo = sum(sizes[:i])
        inputs, targets = self._batch(t)
        plan = self.plan
        versions = [self.version(k, microbatch_version(plan, k, j, self.drains)) for k in range(plan.n_stages)]
        weights = [{n: w.clone().requires_grad_(True) for n, w in v.items()} for v in versions]
        x = inputs[lo:lo + sizes[i]]
        for module, w in zip(self.modules, weights, strict=True):
            x = functional_call(module, w, (x,))
        divisor = sizes[i] if self.plan.spec.loss_per_microbatch else self.plan.batch_size
        torch.autograd.backward(self.loss(x, targets[lo:lo + sizes[i]]) / divisor)
        return [{n: (w.grad if w.grad is not None else torch.zeros_like(w)) for n, w in ws.items()} for ws in weights]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers under its own names."""
        out: dict[str, torch.Tensor] = {}
        for stage, module in zip(self.plan.stages, self.modules, strict=True):
            layers = self.graph.layers_named(stage.layers)
            for layer, child in zip(layers, module.children(), strict=True):
                for name, value in child.state_dict().items():
                    out[layer.qualified(name)] = value.detach().clone()
        return out


def emulate_async(graph: LayerGraph, plan: Plan, config: TrainConfig,
                  drains: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """Train ``plan`` (pipedream or 2bw) for ``config.steps`` batches in one process, draining the
    pipeline before each batch of ``drains`` (a run that checkpoints: its checkpoint steps); the final
    state_dict (parameters and buffers) under the model's own names, as the runtime's ``TrainResult.state_dict``.

    Raises:
        UserError: a synchronous plan, or a learning-rate schedule other than constant.
    """
    if not plan.asynchronous:
        raise UserError(f"the emulator runs pipedream and 2bw, not {plan.method.value}; use reference_train")
    if config.lr_schedule != "constant":
        raise UserError("the emulator needs --lr-schedule constant (the runtime sets a rate per batch)")
    plan.validate(graph.names)
    emulator = _Emulator(graph, plan, config, drains)
    m = len(plan.stages[0].forward_sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for j in range(config.steps * m):
            emulator.gradient(j)
        for k in range(plan.n_stages):
            _finish(emulator, k, config.steps * m)
    return emulator.state_dict()


def _finish(emulator: _Emulator, k: int, n_micro: int) -> None:
    """Run stage ``k``'s remaining steps: one per group of the run's ``n_micro`` micro-batches."""
    size = len(step_group(emulator.plan, k, 0))
    emulator.version(k, n_micro // size)

