"""Real models as they are (issue 26): GPT-2 and ResNet-18, pipetrain against torch's ``pipeline()`` and one process.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_models.py --rounds 4 --steps 10 --top 2 \\
        --out benchmarks/results/real-models
    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_models.py --quick --out /tmp/real-quick      # smoke run

The models, unchanged: transformers' ``GPT2LMHeadModel`` (6 blocks, width 256, 4 heads, vocabulary
2,048, context 128, dropout 0, head tied to the token embedding; random init) on synthetic token
windows given as Hugging Face dicts (``input_ids``, ``labels``; :func:`gpt2_data`), trained on the
next-token loss; and torchvision's ResNet-18 structure (``tests.vision_models.resnet18``: 7×7 stem,
BasicBlocks [2, 2, 2, 2], widths 64 to 512, BatchNorm) at 64×64 with 10 classes on synthetic images
(:func:`resnet18_data`), on cross-entropy. Every side trains on the same batches (pipetrain's
step-indexed sampling of the same datasets), the loss summed over samples / batch, plain SGD.

* **pipetrain**, as a user gets it: ``api.resolve_model(model, data=...)`` (torch.export capture at
  block granularity), ``api.profile_model`` here, ``api.plan`` for 2 local ranks with the default
  planner (``balanced``, what ``pipetrain.train`` uses) and with ``auto`` (every planner, the fastest
  prediction kept), then ``pipetrain.runtime.train``. Plan time = profile time + planner time.
* **torch**: ``torch.distributed.pipelining.pipeline()`` on the same model, split at the same block
  boundary as pipetrain's balanced plan (GPipe, 1F1B), or for the schedules with two chunks per rank
  at the blocks of pipetrain's own 4-chunk partition (looping: Interleaved1F1B, LoopedBFS,
  InterleavedZeroBubble; V: ZBVZeroBubble, DualPipeV), stages from ``Pipe.build_stage``, every
  schedule at each micro-batch count of ``--micro`` that torch allows (:mod:`torch_schedules`),
  ``scale_grads=False``, ``return_outputs=False``. Where torch cannot run its own split (its error is
  recorded), the same schedule runs on ``PipelineStage`` s built by hand from the same blocks,
  pipetrain's captured layers (labels ending ``captured``). torch's ``pipeline()`` copies a tied
  weight into every stage that uses it and never syncs the copies' gradients (a TODO in its
  ``_IR.py``): that trains an untied model, so the rank code here sums the tied copies' gradients
  (one all-reduce per step, as pipetrain does) to train the same model.
* **single**: the plain model in one process, one thread.

Every process runs one thread (``torch.set_num_threads(1)``), 2 ranks on 2 cores, gloo on
127.0.0.1, and keeps freed memory in its heap (pipetrain's default allocator setting,
:mod:`pipetrain.allocator`, applied to the torch and single processes too, so the comparison is of
schedules, not of ``malloc``). A run's samples/s is the batch over its median step after
``WARMUP_STEPS`` warm-up steps (a step: the slowest rank's schedule step, tied-gradient sum and SGD
step). Round 1 runs every configuration; later rounds run pipetrain's plans, single and the ``--top``
fastest torch configurations of round 1, back to back in an order rotated each round. The best torch
configuration is the fastest by median among those run every round; ratios are medians of the
within-round ratios, throughputs medians across rounds.

Output under ``--out``: ``real_models.json`` (setup, plan times, every run; rewritten after each run)
and ``real_models.md`` (the tables).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.vision_models

from common.torch_baseline import N_RANKS, WARMUP_STEPS, TorchRun, launch_timed
from common.torch_schedules import SCHEDULES, schedule_of

from pipetrain.data import StepLoader
from pipetrain.graph.layer_graph import LayerGraph, LossKind, loss_sum
from pipetrain.graph.packing import pack
from pipetrain.plan.plan import Plan

SEED = 0
LR = 0.01
VOCAB, CONTEXT = 2048, 128
IMAGE, CLASSES = (3, 64, 64), 10
TRAIN_SAMPLES, EVAL_SAMPLES = 512, 64


# ---- the models and their data ----------------------------------------------------------------


def build_gpt2(use_cache: bool = False) -> nn.Module:
    """transformers' GPT-2 of 6 blocks, width 256, 4 heads, random init (about 5.3 M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, use_cache=use_cache)
    return GPT2LMHeadModel(config)


def build_resnet18() -> nn.Module:
    """torchvision's ResNet-18 structure with 10 classes (about 11.2 M parameters)."""
    from tests.vision_models import resnet18

    return resnet18(CLASSES)


class TokenWindows(Dataset[dict[str, torch.Tensor]]):
    """Rows of ``tokens`` as Hugging Face samples: ``{"input_ids": [T], "labels": [T]}`` (the model shifts)."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


@cache
def _tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, VOCAB, (TRAIN_SAMPLES + EVAL_SAMPLES, CONTEXT), generator=generator)


@cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    n = TRAIN_SAMPLES + EVAL_SAMPLES
    return torch.randn(n, *IMAGE, generator=generator), torch.randint(0, CLASSES, (n,), generator=generator)


def gpt2_data() -> tuple[TokenWindows, TokenWindows]:
    """Train and eval token windows (``--data bench_real_models:gpt2_data``)."""
    tokens = _tokens()
    return TokenWindows(tokens[:TRAIN_SAMPLES]), TokenWindows(tokens[TRAIN_SAMPLES:])


def resnet18_data() -> tuple[TensorDataset, TensorDataset]:
    """Train and eval ``(image [3, 64, 64], class)`` samples."""
    x, y = _images()
    return TensorDataset(x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES]), TensorDataset(x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:])


@dataclass(frozen=True)
class RealModel:
    """One benchmarked model: how to build it, its data (a pipetrain source) and batch."""

    name: str
    batch: int
    data: str
    keyword: str | None  # the model's input keyword (Hugging Face), or None: one positional input
    build: Callable[[], nn.Module]

    @property
    def loss_kind(self) -> LossKind:
        return LossKind.CAUSAL_LM if self.keyword else LossKind.CROSS_ENTROPY

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of step ``step``: the rows pipetrain's loader takes (same seed)."""
        rows = StepLoader(range(TRAIN_SAMPLES), self.batch, SEED).rows(step)  # type: ignore[arg-type]
        if self.keyword:
            tokens = _tokens()[rows]
            return tokens, tokens
        x, y = _images()
        return x[rows], y[rows]

    def call(self, inputs: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """The model's ``(args, kwargs)`` for ``inputs``."""
        return ((), {self.keyword: inputs}) if self.keyword else ((inputs,), {})

    def loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The loss summed over samples / batch, on the logits of ``output`` (a tensor, tuple or ModelOutput)."""
        logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
        logits = output[0] if logits is None else logits
        return loss_sum(self.loss_kind, logits, target) / self.batch


MODELS: dict[str, RealModel] = {
    "gpt2": RealModel("gpt2", 16, "bench_real_models:gpt2_data", "input_ids", build_gpt2),
    "resnet18": RealModel("resnet18", 32, "bench_real_models:resnet18_data", None, build_resnet18),
}


# ---- torch's pipeline() and the single process, on spawned ranks ---------------------------------


@dataclass(frozen=True)
class TorchJob:
    """One torch run (picklable). ``splits``: the block starting each stage after the first;
    ``schedule`` empty: the plain model in one process. ``captured``: stages built by hand from
    pipetrain's captured layers (the same blocks), where torch's ``pipeline()`` split cannot run."""

    model: str
    steps: int
    schedule: str = ""
    n_micro: int = 1
    splits: tuple[str, ...] = ()
    captured: LayerGraph | None = None


def _rank_setup() -> None:
    from pipetrain.allocator import keep_freed_memory

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    keep_freed_memory()
    torch.manual_seed(SEED)


def _single_rank(rank: int, port: int, job: TorchJob) -> list[float]:
    """The plain model trained in this process: its step times."""
    _rank_setup()
    model = MODELS[job.model]
    module = model.build().train()
    optimizer = torch.optim.SGD(module.parameters(), lr=LR)
    times = []
    for step in range(job.steps):
        inputs, targets = model.batch_at(step)
        args, kwargs = model.call(inputs)
        t0 = time.perf_counter()
        torch.autograd.backward(model.loss(module(*args, **kwargs), targets))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


Tied = tuple[tuple[str, ...], torch.Size]


def tied_groups(module: nn.Module) -> list[Tied]:
    """The names that share one parameter in ``module``, and its shape (GPT-2: ``transformer.wte.weight``
    and ``lm_head.weight``)."""
    names: dict[int, tuple[list[str], torch.Size]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), ([], p.shape))[0].append(name)
    return [(tuple(group), shape) for group, shape in names.values() if len(group) > 1]


def _sum_tied(named: Sequence[tuple[str, nn.Parameter]], groups: Sequence[Tied]) -> None:
    """Give every copy of each tied parameter (by the model's names) the sum of all copies'
    gradients, over all ranks (a rank without a copy adds zeros)."""
    import torch.distributed as dist

    for group, shape in groups:
        copies = [p for name, p in named if name in group]
        total = torch.zeros(shape)
        for p in copies:
            if p.grad is not None:
                total += p.grad
        dist.all_reduce(total)
        for p in copies:
            p.grad = total.clone()


def _torch_rank(rank: int, port: int, job: TorchJob) -> list[float]:
    """This rank's stages of torch's ``pipeline()`` split, run by ``job.schedule``: its step times."""
    import torch.distributed as dist
    import torch.distributed.pipelining as pipelining

    _rank_setup()
    model, spec = MODELS[job.model], schedule_of(job.schedule)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=N_RANKS,
                            timeout=timedelta(seconds=600))
    try:
        module = model.build().train()
        groups = tied_groups(module)
        mine, n_stages = spec.rank_stages(rank, N_RANKS), spec.n_stages(N_RANKS)
        stages, named = (_captured_stages(job, mine, n_stages) if job.captured is not None
                         else _pipeline_stages(module, job, mine, n_stages))
        cls = getattr(pipelining, spec.class_name)
        schedule = cls(stages if spec.multi else stages[0], job.n_micro, loss_fn=model.loss, scale_grads=False)
        optimizer = torch.optim.SGD([p for _, p in named], lr=LR)
        first, last = 0 in mine, n_stages - 1 in mine
        times = []
        for step in range(job.steps):
            inputs, targets = model.batch_at(step)
            args, kwargs = ((_packed(model, inputs),), {}) if job.captured is not None else model.call(inputs)
            args, kwargs = (args, kwargs) if first else ((), {})
            dist.barrier()
            t0 = time.perf_counter()
            schedule.step(*args, target=targets if last else None, return_outputs=False, **kwargs)
            _sum_tied(named, groups)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        dist.barrier()
        return times
    finally:
        dist.destroy_process_group()


Named = list[tuple[str, nn.Parameter]]


def _packed(model: RealModel, inputs: torch.Tensor) -> torch.Tensor:
    """The captured graph's one input: the keyword inputs packed (:mod:`pipetrain.graph.packing`), or the tensor."""
    return pack([inputs]) if model.keyword else inputs


def _pipeline_stages(module: nn.Module, job: TorchJob, mine: Sequence[int], n_stages: int) -> tuple[list[Any], Named]:
    """This rank's ``PipelineStage`` s of torch's ``pipeline()`` split, and their parameters by the model's names."""
    import torch.distributed.pipelining as pipelining

    model = MODELS[job.model]
    args, kwargs = model.call(model.batch_at(0)[0][: model.batch // job.n_micro])
    pipe = pipelining.pipeline(module, mb_args=args, mb_kwargs=kwargs,
                               split_spec={name: pipelining.SplitPoint.BEGINNING for name in job.splits})
    assert pipe.num_stages == n_stages, f"pipeline() made {pipe.num_stages} stages, not {n_stages}"
    stages = [pipe.build_stage(s, torch.device("cpu")) for s in mine]
    return stages, [(name, p) for stage in stages for name, p in stage.submod.named_parameters()]


def _captured_stages(job: TorchJob, mine: Sequence[int], n_stages: int) -> tuple[list[Any], Named]:
    """This rank's ``PipelineStage`` s built by hand from pipetrain's captured layers, cut at ``job.splits``."""
    import torch.distributed.pipelining as pipelining

    graph = job.captured
    assert graph is not None
    starts = [0, *(graph.names.index(name) for name in job.splits), len(graph)]
    stages, named = [], []
    for s in mine:
        layers = range(starts[s], starts[s + 1])
        chunk = nn.Sequential(*(graph.build_layer(i) for i in layers))
        stages.append(pipelining.PipelineStage(chunk, s, n_stages, torch.device("cpu")))
        named += [(graph.layers[i].qualified(name), p) for i, layer in zip(layers, chunk, strict=True)
                  for name, p in layer.named_parameters()]
    return stages, named


def pipeline_failure(build: Callable[[], nn.Module], model: RealModel, split: str) -> str | None:
    """What torch's ``pipeline()`` says about ``build()`` split at ``split``, or None when it splits it."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    args, kwargs = model.call(model.batch_at(0)[0][:2])
    try:
        pipeline(build(), mb_args=args, mb_kwargs=kwargs, split_spec={split: SplitPoint.BEGINNING})
    except Exception as e:  # the failure is the result
        cause = e.__cause__ or e
        return f"{type(e).__name__}: {str(e).splitlines()[0]} (cause: {str(cause).splitlines()[0]})"
    return None


# ---- pipetrain's side ---------------------------------------------------------------------------


@dataclass
class Setup:
    """What is decided once per model, before the rounds."""

    model: RealModel
    graph: LayerGraph
    plans: dict[str, Plan]  # "balanced", "auto"
    seconds: dict[str, float]  # capture, profile, balanced, auto (planner only)
    splits: dict[str, tuple[str, ...]]  # "stages", "loop", "v" -> torch split points
    torch_configs: list[tuple[str, int]]
    pipeline_default: str | None  # what pipeline() says about the model with its default config (GPT-2: a KV cache)
    pipeline_errors: dict[str, str] = field(default_factory=dict)  # torch configuration -> what failed

    def describe(self, label: str) -> str:
        plan = self.plans[label]
        stages = " | ".join(f"{s.layers[0]}..{s.layers[-1]}" + (f" ×{len(s.ranks)}" if len(s.ranks) > 1 else "")
                            for s in plan.stages)
        return f"{plan.method.value} m={len(plan.stages[0].forward_sizes)}: {stages}"


def setup_model(model: RealModel, micro: Sequence[int]) -> Setup:
    """Capture, profile and plan ``model`` as a user would (timed), and derive torch's split points."""
    from pipetrain import api
    from pipetrain.cost import CostModel
    from pipetrain.plan.methods import Method
    from pipetrain.planners.contract import ModelRef
    from pipetrain.planners.interleaved import build_interleaved_plan

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    graph = api.resolve_model(model.build(), data=model.data, name=model.name)
    seconds["capture"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    profile = api.profile_model(graph, model.batch)
    seconds["profile"] = time.perf_counter() - t0
    cluster = api.local_cluster(N_RANKS)
    plans = {}
    for planner in ("balanced", "auto"):
        t0 = time.perf_counter()
        plans[planner] = api.plan(graph, profile, cluster, batch_size=model.batch, planner=planner).plan
        seconds[planner] = time.perf_counter() - t0
    balanced = plans["balanced"]
    m = len(balanced.stages[0].forward_sizes)
    splits = {"stages": tuple(s.layers[0] for s in balanced.stages[1:])}
    cost = CostModel(profile, cluster)
    for placement, method in (("loop", Method.INTERLEAVED), ("v", Method.ZBV)):
        chunks = build_interleaved_plan(ModelRef.of(graph), cost, n_ranks=N_RANKS, chunks=2, batch_size=model.batch,
                                        n_micro=m, method=method)
        splits[placement] = tuple(s.layers[0] for s in chunks.stages[1:])
    configs = [(name, n) for name, spec in SCHEDULES.items() for n in micro if spec.allows(n, N_RANKS)]
    default = pipeline_failure(lambda: build_gpt2(use_cache=True), model, splits["stages"][0]) \
        if model.name == "gpt2" else None
    setup = Setup(model, graph, plans, seconds, splits, configs, default)
    print(f"[{model.name}] capture {seconds['capture']:.1f} s, profile {seconds['profile']:.1f} s, "
          f"balanced {seconds['balanced']:.1f} s: {setup.describe('balanced')}; auto {seconds['auto']:.1f} s: "
          f"{setup.describe('auto')}; torch splits {splits}", flush=True)
    return setup


# ---- the rounds ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One measurement."""

    model: str
    label: str
    round: int
    status: str
    samples_per_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def run_pipetrain(setup: Setup, planner: str, steps: int, timeout_s: float) -> TorchRun:
    """pipetrain's plan of ``planner`` trained ``steps`` steps on its spawned ranks."""
    from pipetrain.runtime import TrainConfig, train

    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, lr=LR, data=setup.model.data, progress=False,
                         threads_per_rank=1, timeout_s=timeout_s)
    start = time.perf_counter()
    try:
        result = train(setup.graph, setup.plans[planner], config)
    except Exception as e:  # a failed run is a result
        return TorchRun(f"error: {type(e).__name__}: {str(e).splitlines()[0]}", wall_s=time.perf_counter() - start)
    return TorchRun("ok", result.samples_per_s, tuple(result.step_times_s), time.perf_counter() - start)


CAPTURED = " captured"
"""The suffix of a torch configuration run on stages built by hand from pipetrain's captured layers."""


def run_label(setup: Setup, label: str, steps: int, timeout_s: float) -> TorchRun:
    """One run of ``label``: ``pipetrain``/``pipetrain-auto``, ``single`` or ``torch <schedule> m=<m>[ captured]``."""
    name = setup.model.name
    if label.startswith("pipetrain"):
        return run_pipetrain(setup, "auto" if label == "pipetrain-auto" else "balanced", steps, timeout_s)
    if label == "single":
        return launch_timed(TorchJob(name, steps), setup.model.batch, timeout_s, _single_rank, n_ranks=1)
    captured = label.endswith(CAPTURED)
    _, schedule, m = label.removesuffix(CAPTURED).split()
    spec = schedule_of(schedule)
    splits = setup.splits["stages" if not spec.multi else spec.placement]
    job = TorchJob(name, steps, schedule, int(m.removeprefix("m=")), splits, setup.graph if captured else None)
    return launch_timed(job, setup.model.batch, timeout_s, _torch_rank)


def own_labels(setup: Setup) -> list[str]:
    """pipetrain's plans (auto's when it differs from the default) and the single process."""
    auto = ["pipetrain-auto"] if setup.plans["auto"] != setup.plans["balanced"] else []
    return ["pipetrain", *auto, "single"]


def run_rounds(setups: Sequence[Setup], rounds: int, steps: int, timeout_s: float, top: int,
               save: Callable[[list[Run]], None]) -> list[Run]:
    """Round 1 runs every configuration: each torch schedule on torch's ``pipeline()`` split and,
    where that fails (tried at the schedule's first micro-batch count only), on captured stages. Later
    rounds run pipetrain's plans, single and the ``top`` fastest torch configurations of round 1, in
    an order rotated each round."""
    runs: list[Run] = []

    def one(setup: Setup, label: str, r: int) -> Run:
        result = run_label(setup, label, steps, timeout_s)
        run = Run(setup.model.name, label, r, result.status, result.samples_per_s, list(result.step_times_s),
                  result.wall_s)
        runs.append(run)
        sps = f"{run.samples_per_s:7.1f} samples/s" if run.samples_per_s else run.status
        print(f"round {r + 1} {run.model:8s} {label:36s} {sps}  [{run.wall_s:.0f} s]", flush=True)
        save(runs)
        return run

    chosen: dict[str, list[str]] = {}
    for setup in setups:
        for label in own_labels(setup):
            one(setup, label, 0)
        fastest: dict[str, float] = {}
        for schedule, m in setup.torch_configs:
            label = f"torch {schedule} m={m}"
            failed = any(failure.startswith(f"torch {schedule} ") for failure in setup.pipeline_errors)
            run = one(setup, label + CAPTURED if failed else label, 0)
            if run.status not in ("ok", "timeout") and not failed:
                setup.pipeline_errors[label] = run.status
                label += CAPTURED
                run = one(setup, label, 0)
            if run.samples_per_s:
                fastest[label] = run.samples_per_s
        chosen[setup.model.name] = sorted(fastest, key=lambda label: -fastest[label])[:top]
    jobs = [(s, label) for s in setups for label in own_labels(s) + chosen[s.model.name]]
    for r in range(1, rounds):
        shift = (r * len(jobs)) // rounds
        for setup, label in jobs[shift:] + jobs[:shift]:
            one(setup, label, r)
    return runs


# ---- the report ---------------------------------------------------------------------------------


def _by_round(runs: Sequence[Run], model: str, label: str) -> dict[int, float]:
    return {r.round: r.samples_per_s for r in runs if r.model == model and r.label == label and r.samples_per_s}


def _ratio(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float | None, list[float]]:
    """Median of ``a / b`` over the rounds both have, and the ratios."""
    ratios = [a[r] / b[r] for r in sorted(a.keys() & b.keys())]
    return (statistics.median(ratios) if ratios else None), ratios


def summary(setups: Sequence[Setup], runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """Per model: each configuration's median samples/s, the best torch one, the paired ratios."""
    out: dict[str, dict[str, Any]] = {}
    for setup in setups:
        name = setup.model.name
        labels = dict.fromkeys(r.label for r in runs if r.model == name)
        rounds = {label: _by_round(runs, name, label) for label in labels}
        medians = {label: statistics.median(v.values()) for label, v in rounds.items() if v}
        most = max((len(v) for label, v in rounds.items() if label.startswith("torch")), default=0)
        paired = {label: medians[label] for label, v in rounds.items() if label.startswith("torch") and len(v) == most}
        best = max(paired, key=lambda label: paired[label]) if most else None  # among those run every round
        ratios: dict[str, Any] = {}
        for own in (label for label in medians if label.startswith("pipetrain")):
            for other in ("single", best):
                if other is not None:
                    median, pairs = _ratio(_by_round(runs, name, own), _by_round(runs, name, other))
                    ratios[f"{own} / {other}"] = {"median": median, "pairs": pairs}
        failed = sorted({f"{r.label}: {r.status}" for r in runs if r.model == name and r.status != "ok"})
        out[name] = {"medians": medians, "rounds": {label: len(v) for label, v in rounds.items()},
                     "torch_best": best, "ratios": ratios, "failed": failed}
    return out


def report(setups: Sequence[Setup], runs: Sequence[Run]) -> str:
    """The markdown tables: throughput and ratios per model, then plan times."""
    result = summary(setups, runs)
    lines = ["| model | configuration | samples/s (median) | ms/step |", "|---|---|---:|---:|"]
    for setup in setups:
        s = result[setup.model.name]
        shown = [label for label in s["medians"] if not label.startswith("torch")]
        shown += [s["torch_best"]] if s["torch_best"] else []
        for label in shown:
            sps = s["medians"][label]
            what = {"pipetrain": f"pipetrain balanced ({setup.describe('balanced')})",
                    "pipetrain-auto": f"pipetrain auto ({setup.describe('auto')})"}.get(label, label)
            what += " (best torch)" if label == s["torch_best"] else ""
            lines.append(f"| {setup.model.name} b={setup.model.batch} | {what} | {sps:.1f} | "
                         f"{setup.model.batch / sps * 1e3:.0f} |")
    lines += ["", "| model | ratio | median of rounds | per round |", "|---|---|---:|---|"]
    for setup in setups:
        for key, value in result[setup.model.name]["ratios"].items():
            median = f"{value['median']:.3f}" if value["median"] is not None else "-"
            lines.append(f"| {setup.model.name} | {key} | {median} | {', '.join(f'{x:.3f}' for x in value['pairs'])} |")
    lines += ["", "| model | torch configuration | samples/s (median) | rounds |", "|---|---|---:|---:|"]
    for setup in setups:
        s = result[setup.model.name]
        lines += [f"| {setup.model.name} | {label} | {sps:.1f} | {s['rounds'][label]} |"
                  for label, sps in s["medians"].items() if label.startswith("torch")]
        lines += [f"| {setup.model.name} | {line} | - | - |" for line in s["failed"]]
    lines += ["", "| model | capture s | profile s | balanced planner s | auto planner s | plan time s "
              "(profile + balanced) |", "|---|---:|---:|---:|---:|---:|"]
    for setup in setups:
        t = setup.seconds
        lines.append(f"| {setup.model.name} | {t['capture']:.1f} | {t['profile']:.1f} | {t['balanced']:.1f} | "
                     f"{t['auto']:.1f} | {t['profile'] + t['balanced']:.1f} |")
    return "\n".join(lines) + "\n"


def _setup_json(setup: Setup) -> dict[str, Any]:
    return {"model": setup.model.name, "batch": setup.model.batch, "data": setup.model.data,
            "layers": list(setup.graph.names), "seconds": setup.seconds,
            "plans": {k: setup.describe(k) for k in setup.plans},
            "plans_json": {k: json.loads(p.to_json()) for k, p in setup.plans.items()},
            "torch_splits": setup.splits, "pipeline_with_default_config": setup.pipeline_default or "ok",
            "pipeline_errors": setup.pipeline_errors}


def main(argv: Sequence[str] | None = None) -> None:
    from pipetrain.fileio import write_atomic

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help=f"steps per run, the first {WARMUP_STEPS} untimed")
    p.add_argument("--micro", type=int, nargs="+", default=[4, 8], help="torch's micro-batch counts")
    p.add_argument("--top", type=int, default=2, help="torch configurations kept after round 1")
    p.add_argument("--timeout", type=float, default=150.0, help="wall-clock bound per run (s)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/real-models"))
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, 3 steps, m=4 only")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.micro = 1, WARMUP_STEPS + 1, [4]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": torch.multiprocessing.cpu_count(), "rounds": args.rounds, "steps": args.steps,
            "warmup_steps": WARMUP_STEPS, "micro": args.micro, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    setups = [setup_model(MODELS[name], args.micro) for name in args.models]

    def save(runs: list[Run]) -> None:
        data = {"meta": meta, "models": [_setup_json(s) for s in setups], "runs": [asdict(r) for r in runs],
                "summary": summary(setups, runs)}
        write_atomic(args.out / "real_models.json", json.dumps(data, indent=1))

    runs = run_rounds(setups, args.rounds, args.steps, args.timeout, args.top, save)
    text = report(setups, runs)
    write_atomic(args.out / "real_models.md", text)
    print(text)


if __name__ == "__main__":
    main()
