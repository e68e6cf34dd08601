"""Small models and plans shared by the multi-process tests."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
from torch import nn

from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.plan.methods import Method
from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.plan.stage_graph import induced_edges
from pipetrain.runtime.job.config import TrainResult

FEATURES = 8
CLASSES = 4


def mlp_graph(n_blocks: int = 4, width: int = 16, features: int = FEATURES, classes: int = CLASSES) -> LayerGraph:
    """``n_blocks`` × (Linear, ReLU) then a Linear head: ``n_blocks + 1`` layers."""
    torch.manual_seed(1)
    layers: list[tuple[str, nn.Module]] = []
    for i in range(n_blocks):
        layers.append((f"block{i}", nn.Sequential(nn.Linear(features if i == 0 else width, width), nn.ReLU())))
    layers.append(("head", nn.Linear(width, classes)))
    return LayerGraph.from_layers(
        layers, input=TensorSpec((features,)), target=TensorSpec((), "int64", high=classes), name="mlp-test"
    )


def cut(names: Sequence[str], n_stages: int) -> list[tuple[str, ...]]:
    """Consecutive, nearly equal groups of layer names (the last groups are the larger)."""
    bounds = [round(k * len(names) / n_stages) for k in range(n_stages + 1)]
    return [tuple(names[bounds[k]:bounds[k + 1]]) for k in range(n_stages)]


def chain_plan(graph: LayerGraph, n_stages: int, batch: int, n_micro: int, method: Method = Method.GPIPE) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(layers, (k,), sizes, sizes) for k, layers in enumerate(cut(graph.names, n_stages)))
    return Plan(graph.name, "", batch, method, stages)


def v_plan(graph: LayerGraph, batch: int, n_ranks: int, n_micro: int, method: Method = Method.ZBV) -> Plan:
    """``2R`` stages of the graph's layers in a V (zbv, dualpipev): stage ``s`` on rank ``s`` (``s < R``)
    or ``2R − 1 − s``, ``n_micro`` equal micro-batches."""
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan(layers, (v_rank(k, n_ranks),), sizes, sizes)
                   for k, layers in enumerate(cut(graph.names, 2 * n_ranks)))
    return Plan(f"{method.value}-test", "", batch, method, stages)


def replicated_plan(
    graph: LayerGraph, replicas: Sequence[int], batch: int, n_micro: int, method: Method = Method.ONE_F_ONE_B
) -> Plan:
    """Stage ``k`` on ``replicas[k]`` consecutive ranks (data parallel inside the stage)."""
    sizes = equal_sizes(batch, n_micro)
    stages, first = [], 0
    for layers, r in zip(cut(graph.names, len(replicas)), replicas, strict=True):
        stages.append(StagePlan(layers, tuple(range(first, first + r)), sizes, sizes))
        first += r
    return Plan(graph.name, "", batch, method, tuple(stages))


def uneven_plan(
    graph: LayerGraph,
    partitions: Sequence[tuple[int, ...]],
    backward: Sequence[tuple[int, ...]] | None = None,
    method: Method = Method.UEDP,
) -> Plan:
    """UMPIPE-style: stage ``k`` uses ``partitions[k]`` for forward and ``backward[k]`` (default: the
    same) for backward; stages whose two differ recompute."""
    batch = sum(partitions[0])
    backward = partitions if backward is None else backward
    groups = cut(graph.names, len(partitions))
    stages = tuple(
        StagePlan(layers, (k,), fwd, bwd)
        for k, (layers, fwd, bwd) in enumerate(zip(groups, partitions, backward, strict=True))
    )
    return Plan(graph.name, "", batch, method, stages)


def random_sizes(rng: np.random.Generator, batch: int) -> tuple[int, ...]:
    """A random composition of ``batch`` with sizes of 1 likely: cuts after each sample with p 0.1–0.7."""
    cuts = rng.random(batch - 1) < rng.uniform(0.1, 0.7)
    ends = [*(i + 1 for i in np.flatnonzero(cuts)), batch]
    return tuple(int(b - a) for a, b in zip([0, *ends[:-1]], ends, strict=True))


def random_uedp_plan(graph: LayerGraph, n_stages: int, batch: int, seed: int) -> Plan:
    """Random forward partitions per stage; stages ``k`` with ``k + seed`` even get another random
    backward partition (and recompute), the others use the forward one."""
    rng = np.random.default_rng(seed)
    forward = [random_sizes(rng, batch) for _ in range(n_stages)]
    backward = [random_sizes(rng, batch) if (k + seed) % 2 == 0 else x for k, x in enumerate(forward)]
    return uneven_plan(graph, forward, backward)


def max_param_diff(result: TrainResult, reference: TrainResult) -> float:
    assert set(result.state_dict) == set(reference.state_dict)
    return max((result.state_dict[k] - reference.state_dict[k]).abs().max().item() for k in reference.state_dict)


def rank_processes() -> list[int]:
    """Live (non-zombie) children of this process, other than multiprocessing's resource tracker."""
    me, out = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            out.append(int(stat.parent.name))
    return out


class Concat(nn.Module):
    """The merge of a branchy test model: its inputs side by side on the last dimension."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=-1)


def branchy_graph(width: int = 12, features: int = FEATURES, classes: int = CLASSES) -> LayerGraph:
    """A diamond: ``stem`` forks into branch ``a1 -> a2`` and branch ``b1``, ``merge`` concatenates
    them, ``head`` classifies. Six layers, a DAG."""
    torch.manual_seed(2)
    layers: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(nn.Linear(features, width), nn.Tanh())),
        ("a1", nn.Sequential(nn.Linear(width, width), nn.Tanh())),
        ("b1", nn.Sequential(nn.Linear(width, width // 2), nn.Tanh())),
        ("a2", nn.Sequential(nn.Linear(width, width), nn.Tanh())),
        ("merge", Concat()),
        ("head", nn.Linear(width + width // 2, classes)),
    ]
    graph = LayerGraph.from_layers(layers, input=TensorSpec((features,)),
                                   target=TensorSpec((), "int64", high=classes), name="branchy-test")
    edges = (("stem", "a1"), ("a1", "a2"), ("stem", "b1"), ("a2", "merge"), ("b1", "merge"), ("merge", "head"))
    return LayerGraph(graph.name, graph.layers, graph.input, graph.target, graph.loss, graph.seed, edges)


def graph_plan(graph: LayerGraph, stages: Sequence[Sequence[str]], ranks: Sequence[Sequence[int]],
               partitions: Sequence[tuple[int, ...]]) -> Plan:
    """A method-graph plan of the given stages, its edges the ones the layers induce."""
    plans = tuple(StagePlan(tuple(s), tuple(r), p, p) for s, r, p in zip(stages, ranks, partitions, strict=True))
    return Plan(graph.name, "", sum(partitions[0]), Method.GRAPH, plans, edges=induced_edges(graph, stages))


class Towers(nn.Module):
    """A user's two-tower module: towers ``a`` and ``b`` on the input, a bilinear merge, a head.
    Captured with torch.fx it is a DAG with two source layers (``a.0`` and ``b.0``)."""

    def __init__(self, features: int = FEATURES, classes: int = CLASSES) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a = nn.Sequential(nn.Linear(features, 12), nn.Tanh(), nn.Linear(12, 12))
        self.b = nn.Sequential(nn.Linear(features, 6), nn.Tanh())
        self.merge = nn.Bilinear(12, 6, 10)
        self.head = nn.Linear(10, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.merge(self.a(x), self.b(x))))


def check_resume_and_reshard(graph: LayerGraph, plan: Plan, tmp_path: Path, eval_every: int = 0
                             ) -> TrainResult:
    """A plan whose ranks run several stages, trained on the digits with Adam: 4 steps + resume to 8
    equals 8 unbroken steps bit for bit (a rank's shard holds all its stages), and the same checkpoint
    resumes under a plain 2-stage 1f1b plan (resharded by name) within 1e-4. Returns the unbroken run."""
    from dataclasses import replace

    from pipetrain.runtime import TrainConfig, TrainJob, train_many

    def config(name: str, steps: int, resume: Path | None = None) -> TrainConfig:
        return TrainConfig(steps=steps, data="digits", optimizer="adam", lr=3e-3, progress=False, timeout_s=60,
                           checkpoint_dir=tmp_path / name, checkpoint_every=2, resume=resume, eval_every=eval_every)

    unbroken, _ = train_many([TrainJob(graph, plan, config("whole", 8), return_state_dict=True),
                              TrainJob(graph, plan, config("first", 4))])
    one_f_one_b = replace(plan, method=Method.ONE_F_ONE_B,
                          stages=tuple(StagePlan(layers, (k,), s.forward_sizes, s.backward_sizes) for k, (layers, s)
                                       in enumerate(zip(cut(graph.names, 2), plan.stages[:2], strict=True))))
    resumed, resharded = train_many([
        TrainJob(graph, plan, config("second", 8, tmp_path / "first"), return_state_dict=True),
        TrainJob(graph, one_f_one_b, config("resharded", 8, tmp_path / "first"), return_state_dict=True)])
    for name, value in unbroken.state_dict.items():
        assert torch.equal(value, resumed.state_dict[name]), name
    assert [m.loss for m in resumed.metrics] == [m.loss for m in unbroken.metrics[4:]]
    assert max_param_diff(resharded, unbroken) <= 1e-4
    return unbroken


class TiedLM(nn.Module):
    """A token embedding, three blocks and a head whose weight is the embedding's (GPT-2's tie), and,
    with ``shared_blocks``, blocks 0 and 1 sharing their weight too (ALBERT's)."""

    def __init__(self, vocab: int = 11, width: int = 8, shared_blocks: bool = True) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        if shared_blocks:
            self.blocks[1].weight = self.blocks[0].weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens)
        for block in self.blocks:
            h = torch.tanh(block(h))
        return self.lm_head(h)


def tied_lm_graph(seq: int = 5, vocab: int = 11) -> LayerGraph:
    """:class:`TiedLM` captured: layers ``wte, blocks.0, blocks.1, blocks.2, lm_head``, two ties."""
    from pipetrain.graph.capture import capture
    from pipetrain.graph.layer_graph import LossKind

    torch.manual_seed(0)
    tokens = TensorSpec((seq,), "int64", high=vocab)
    return capture(TiedLM(vocab), input=tokens, target=tokens, loss=LossKind.LM, name="tied-lm")


DIABETES_FEATURES = 10


def diabetes_data() -> tuple[torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]], ...]:
    """scikit-learn's diabetes data, bundled with it (no download): 442 patients, 10 features in
    ``[10]`` float32, a year's disease progression out ``[1]`` float32, both standardised on the
    training rows; the first 352 train, the last 90 eval. A data factory for ``data=``."""
    from sklearn.datasets import load_diabetes

    x, y = (torch.as_tensor(a, dtype=torch.float32) for a in load_diabetes(return_X_y=True))
    y = y[:, None]
    train = 352
    x = (x - x[:train].mean(0)) / x[:train].std(0)
    y = (y - y[:train].mean(0)) / y[:train].std(0)
    return (torch.utils.data.TensorDataset(x[:train], y[:train]), torch.utils.data.TensorDataset(x[train:], y[train:]))


def regression_graph(width: int = 32) -> LayerGraph:
    """Three Linear+ReLU blocks and a Linear from :data:`DIABETES_FEATURES` features to one value per
    sample (targets ``[b, 1]`` float32), scored by MSE: a chain of 4 layers."""
    torch.manual_seed(4)
    layers: list[tuple[str, nn.Module]] = [
        (f"block{i}", nn.Sequential(nn.Linear(DIABETES_FEATURES if i == 0 else width, width), nn.ReLU()))
        for i in range(3)]
    layers.append(("out", nn.Linear(width, 1)))
    return LayerGraph.from_layers(layers, input=TensorSpec((DIABETES_FEATURES,)), target=TensorSpec((1,)),
                                  loss=LossKind.MSE, name="regression-test")


def absolute_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A user's loss: the sum over samples of each sample's absolute error (``output``, ``target`` ``[b, 1]``)."""
    return (output - target).abs().sum()
