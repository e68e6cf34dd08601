"""Checkpoints in one process: every rank's context is built here and trained as one chain, saved
through :func:`rank_checkpoint.save` (its gather to rank 0 faked) and resumed through
:func:`rank_checkpoint.resume`. Same plan: bit for bit (SGD, SGD momentum, Adam, AdamW; dropout's RNG;
a buffer); other plans: resharded by name; a save without its manifest, a damaged
shard, a shard that is not tensors, pruning, export, another model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.memory import OPTIMIZER_NAMES, OptimizerName
from pipetrain.plan.plan import Plan
from pipetrain.runtime.interp.context import RankContext
from pipetrain.runtime.interp.rank_setup import build_rank_context
from pipetrain.runtime.interp.transport import Transport
from pipetrain.runtime.job import checkpoint as checkpoint_module
from pipetrain.runtime.job import rank_checkpoint
from pipetrain.runtime.job.checkpoint import (
    MANIFEST,
    Checkpoint,
    export_checkpoint,
    newest_checkpoint,
    stage_state,
    step_folder,
    write_shard,
)
from pipetrain.runtime.job.config import TrainConfig, TrainJob
from pipetrain.runtime.job.data import make_batch
from tests.gloo.models import chain_plan, mlp_graph, replicated_plan

BATCH = 8
RAN: list[str] = []


class _Counter(nn.Module):
    """The identity, counting its training forwards in a buffer (as BatchNorm's running statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: torch.Tensor
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls.add_(1)
        return x


def _graph() -> LayerGraph:
    """Four layers with a buffer (:class:`_Counter`) and dropout (draws from torch's generator)."""
    torch.manual_seed(3)
    layers: list[tuple[str, nn.Module]] = [
        ("block0", nn.Sequential(nn.Linear(8, 16), _Counter(), nn.ReLU())),
        ("block1", nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.25))),
        ("block2", nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.25))),
        ("head", nn.Linear(16, 4)),
    ]
    return LayerGraph.from_layers(layers, input=TensorSpec((8,)), target=TensorSpec((), "int64", high=4),
                                  name="ckpt-test")


def _job(graph: LayerGraph, plan: Plan, optimizer: OptimizerName = "adam", **config: Any) -> TrainJob:
    settings = TrainConfig(steps=6, optimizer=optimizer, lr=0.05, progress=False)
    return TrainJob(graph, plan, replace(settings, **config))


def _contexts(job: TrainJob) -> list[RankContext]:
    """Every rank's context, in rank order."""
    return [build_rank_context(job.graph, job.plan, rank, Transport(torch.device("cpu")), job.config.build_optimizer)
            for rank in range(job.plan.n_ranks)]


def _trainers(job: TrainJob, ctxs: list[RankContext]) -> list[RankContext]:
    """Each stage's first rank, in stage order: the chain that trains."""
    return [ctxs[stage.ranks[0]] for stage in job.plan.stages]


def _train(job: TrainJob, ctxs: list[RankContext], steps: Iterable[int]) -> None:
    """Train the chain of stages on the steps' batches (one process: autograd through all stages)."""
    trainers = _trainers(job, ctxs)
    for step in steps:
        x, y = make_batch(job.graph, BATCH, step, 0, "synthetic")
        for ctx in trainers:
            x = ctx.module(x)
        torch.autograd.backward(nn.functional.cross_entropy(x, y))
        for ctx in trainers:
            assert ctx.optimizer is not None
            ctx.optimizer.step()
            ctx.optimizer.zero_grad(set_to_none=True)


def _snapshot(job: TrainJob, ctxs: list[RankContext]) -> dict[str, torch.Tensor]:
    """Copies of every stage's model and optimizer state by the model's names."""
    out: dict[str, torch.Tensor] = {}
    for ctx in _trainers(job, ctxs):
        layers = job.graph.layers_named(job.plan.stages[ctx.stage].layers)
        state = stage_state(ctx.module, layers, ctx.optimizer, owner=True)
        out.update({k: v.clone() for k, v in (*state["model"].items(), *state["optimizer"].items())})
    return out


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert torch.equal(value, b[name]), name


def _save(job: TrainJob, ctxs: list[RankContext], done: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`rank_checkpoint.save` on every rank, rank 0 last, with the gather to rank 0 faked."""
    gathered: list[Any] = []

    def gather(obj: Any, out: list[Any] | None, dst: int = 0) -> None:
        gathered.append(obj)
        if out is not None:
            out[: len(gathered)] = gathered

    monkeypatch.setattr(dist, "gather_object", gather)  # what job_checkpoint calls
    folders = {rank_checkpoint.save(job, [ctx], ctx.rank, len(ctxs), done) for ctx in reversed(ctxs)}
    return folders.pop()


def _resume(job: TrainJob) -> tuple[list[RankContext], int]:
    """Fresh contexts for ``job`` (``config.resume`` set), each restored; and the step to go on at."""
    ctxs = _contexts(job)
    firsts = {rank_checkpoint.resume(job, [ctx], ctx.rank) for ctx in ctxs}
    assert len(firsts) == 1
    return ctxs, firsts.pop()


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
def test_same_plan_resumes_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       optimizer: OptimizerName) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), optimizer, checkpoint_dir=tmp_path)
    torch.manual_seed(0)
    ctxs = _contexts(job)
    _train(job, ctxs, range(3))
    folder = _save(job, ctxs, 3, monkeypatch)
    _train(job, ctxs, range(3, 6))
    unbroken = _snapshot(job, ctxs)
    torch.manual_seed(99)  # the resumed run must take the RNG state (dropout masks) from the checkpoint
    resumed, first = _resume(replace(job, config=replace(job.config, resume=tmp_path)))
    assert first == 3 and folder == step_folder(tmp_path, 3)
    _train(job, resumed, range(3, 6))
    _assert_equal(unbroken, _snapshot(job, resumed))
    expected = {"sgd": set(), "sgd-momentum": {"momentum_buffer"}, "adam": {"step", "exp_avg", "exp_avg_sq"}}
    kinds = {k.rpartition("/")[2] for k in unbroken if "/" in k}
    assert kinds == expected.get(optimizer, expected["adam"])
    assert int(unbroken["block0.1.calls"]) == 6  # buffers are state too


@pytest.mark.parametrize("n_stages", [3, 1])
def test_another_plan_reshards_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture, n_stages: int) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    ctxs = _contexts(job)
    _train(job, ctxs, range(3))
    _save(job, ctxs, 3, monkeypatch)
    other = _job(graph, chain_plan(graph, n_stages, BATCH, 2), resume=tmp_path)
    with caplog.at_level(logging.WARNING):
        resumed, first = _resume(other)
    assert first == 3 and "RNG states start afresh" in caplog.text
    _assert_equal(_snapshot(job, ctxs), _snapshot(other, resumed))
    for run, contexts in ((job, ctxs), (other, resumed)):  # the same draws: both go on alike
        torch.manual_seed(5)
        _train(run, contexts, range(3, 5))
    _assert_equal(_snapshot(job, ctxs), _snapshot(other, resumed))


def test_replicas_write_only_their_rng_and_any_plan_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph()
    job = _job(graph, replicated_plan(graph, [1, 2], BATCH, 2), checkpoint_dir=tmp_path)
    ctxs = _contexts(job)
    _train(job, ctxs, range(2))
    folder = _save(job, ctxs, 2, monkeypatch)
    shards = {s["rank"]: s for s in json.loads((folder / MANIFEST).read_text())["shards"]}
    assert shards[2]["keys"] == [] and shards[1]["keys"] and shards[0]["keys"]
    for plan in (job.plan, chain_plan(graph, 2, BATCH, 2)):
        resumed_job = _job(graph, plan, resume=tmp_path)
        resumed, _ = _resume(resumed_job)
        _assert_equal(_snapshot(job, ctxs), _snapshot(resumed_job, resumed))
        if plan.replicated:  # both replicas of stage 1 take the state its first rank wrote
            _assert_equal(resumed[1].module.state_dict(), resumed[2].module.state_dict())


def test_a_save_without_its_manifest_is_not_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed after writing shards but before the manifest leaves the previous checkpoint the newest."""
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    ctxs = _contexts(job)
    _save(job, ctxs, 3, monkeypatch)
    for ctx in ctxs:
        layers = graph.layers_named(job.plan.stages[ctx.stage].layers)
        write_shard(tmp_path, 6, ctx.rank, stage_state(ctx.module, layers, ctx.optimizer, owner=True))
    assert (step_folder(tmp_path, 6) / "rank-1.pt").is_file()
    checkpoint = newest_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.step == 3


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_a_damaged_shard_is_skipped_and_reading_it_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    ctxs = _contexts(job)
    _save(job, ctxs, 2, monkeypatch)
    folder = _save(job, ctxs, 4, monkeypatch)
    _damage(folder / "rank-1.pt", how)
    with caplog.at_level(logging.WARNING):
        checkpoint = newest_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.step == 2
    assert "skipping checkpoint" in caplog.text and "truncated or altered" in caplog.text
    damaged = Checkpoint(folder, json.loads((folder / MANIFEST).read_text()))
    with pytest.raises(UserError, match=r"rank-1\.pt is missing, truncated or altered.*delete this folder"):
        damaged.load(damaged.shards[1].keys)


def test_a_resume_hashes_each_shard_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's check, the launcher's and the reads of one process hash a shard once; a shard written
    again (another size or time) is hashed again."""
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    folder = _save(job, _contexts(job), 2, monkeypatch)
    hashed: list[str] = []
    real = checkpoint_module._sha256
    monkeypatch.setattr(checkpoint_module, "_sha256", lambda path: hashed.append(path.name) or real(path))
    for _ in range(2):
        checkpoint = newest_checkpoint(tmp_path)
        assert checkpoint is not None
    checkpoint.load([k for shard in checkpoint.shards for k in shard.keys])
    assert sorted(hashed) == ["rank-0.pt", "rank-1.pt"]
    shard = folder / "rank-1.pt"
    before = shard.stat().st_mtime_ns
    _damage(shard, "flip")  # the same size
    os.utime(shard, ns=(before + 10**9, before + 10**9))  # a coarse clock may not have moved: one second on
    assert newest_checkpoint(tmp_path) is None and hashed[2:] == ["rank-1.pt"]


def _record(text: str) -> None:
    RAN.append(text)


class _Payload:
    """Unpickling it would call :func:`_record`: code that a checkpoint must never run."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_record, ("ran",))


def test_a_shard_that_is_not_tensors_is_refused_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with the manifest's size and SHA-256 rewritten to match, a shard holding a pickled
    object gets one error from ``weights_only=True`` and its code does not run."""
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    folder = _save(job, _contexts(job), 2, monkeypatch)
    shard = folder / "rank-0.pt"
    torch.save({"model": {"block0.0.weight": _Payload()}}, shard)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["shards"][0].update(bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())
    (folder / MANIFEST).write_text(json.dumps(manifest))
    checkpoint = newest_checkpoint(tmp_path)
    assert checkpoint is not None
    with pytest.raises(UserError, match="cannot be read safely"):
        checkpoint.load(checkpoint.shards[0].keys)
    assert RAN == []


def test_keep_leaves_the_newest_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path, keep=2)
    ctxs = _contexts(job)
    for done in (1, 2, 3, 4):
        _save(job, ctxs, done, monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def test_export_loads_into_the_module_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path / "ckpt")
    ctxs = _contexts(job)
    _train(job, ctxs, range(3))
    _save(job, ctxs, 3, monkeypatch)
    checkpoint, tensors, size = export_checkpoint(tmp_path / "ckpt", tmp_path / "model.pt")
    module = graph.build_module()
    module.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True), strict=True)
    assert checkpoint.step == 3 and tensors == len(module.state_dict()) and size > 0
    x, _ = make_batch(graph, BATCH, 9, 0, "synthetic")
    y = x
    for ctx in ctxs:
        y = ctx.module.eval()(y)
    assert torch.equal(module.eval()(x), y)
    with pytest.raises(UserError, match="no whole checkpoint in"):
        export_checkpoint(tmp_path / "empty", tmp_path / "other.pt")


def test_a_checkpoint_of_another_model_or_too_late_is_refused(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph()
    job = _job(graph, chain_plan(graph, 2, BATCH, 2), checkpoint_dir=tmp_path)
    _save(job, _contexts(job), 3, monkeypatch)
    mlp = mlp_graph()
    with pytest.raises(UserError, match=r"is of model 'ckpt-test'.*resume with the model it was trained with"):
        _resume(_job(mlp, chain_plan(mlp, 2, BATCH, 2), resume=tmp_path))
    with pytest.raises(UserError, match="at step 3, not before the 3 steps asked for"):
        _resume(_job(graph, job.plan, resume=tmp_path, steps=3))
    with pytest.raises(UserError, match="no whole checkpoint there"):
        _resume(_job(graph, job.plan, resume=tmp_path / "nothing"))
