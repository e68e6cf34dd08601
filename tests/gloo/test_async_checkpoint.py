"""Checkpoints of the asynchronous methods (level c; docs/algorithms.md §3.5, DESIGN.md §5 invariant 7).

A run of ``pipedream`` (with and without vertical sync) or ``2bw`` that checkpoints every 4 steps
drains its pipeline there (:mod:`pipetrain.schedule.segments`), so 8 steps equal 4 steps + resume 4
bit for bit, and both equal the emulator given the same drain (``emulate_async(..., drains=(4,))``),
which a run without the drain does not. Resuming onto another plan reshards and starts from the saved
weights; a Ctrl-C in mid-segment drains, saves and resumes; ``export`` writes the module's state_dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from pipetrain.errors import Interrupted
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.reference.asynchronous import emulate_async
from pipetrain.runtime import FaultInjection, TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint, step_folder
from pipetrain.runtime.job.config import job_loss
from pipetrain.runtime.job.data import timed_batch

from .models import chain_plan, mlp_graph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCH = 8
TOL = 1e-5
GRAPH = mlp_graph()


def _async(plan: Plan, weights: WeightPolicy) -> Plan:
    method = Method.TWO_BW if weights is WeightPolicy.TWO_BW else Method.PIPEDREAM
    return replace(plan, method=method, weights=weights)


PLANS = {
    "pipedream": _async(chain_plan(GRAPH, 2, BATCH, 2), WeightPolicy.STASH),
    "vertical-sync": _async(chain_plan(GRAPH, 2, BATCH, 2), WeightPolicy.VERTICAL_SYNC),
    "2bw": _async(chain_plan(GRAPH, 2, BATCH, 2), WeightPolicy.TWO_BW),
    "2bw-clipped": _async(chain_plan(GRAPH, 2, BATCH, 2), WeightPolicy.TWO_BW),
}
CLIP = {"2bw-clipped": 0.05}  # 2bw's clipping leaves a segment's last step pending until the checkpoint
# the 2bw checkpoint resumed on three stages of another partition, four micro-batches
RESHARDED = _async(chain_plan(GRAPH, 3, BATCH, 4), WeightPolicy.TWO_BW)
STOP = FaultInjection(0, 5, "interrupt")  # SIGINT reaches rank 0 during step 5


def _config(tmp: Path, name: str, steps: int, **changes: object) -> TrainConfig:
    """Checkpoints every 4 steps into ``tmp / name``; clipping as :data:`CLIP` gives for the plan ``name`` names."""
    clip = next((v for k, v in CLIP.items() if name.startswith(k)), None)
    base = TrainConfig(steps=steps, optimizer="adam", lr=1e-2, progress=False, timeout_s=60,
                       checkpoint_dir=tmp / name, checkpoint_every=4, clip_grad_norm=clip)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("async-checkpoints")


@dataclass(frozen=True)
class Runs:
    """Attributes: results: per plan ``<name>-whole`` (8 steps) and ``<name>`` (4 steps, then resumed
    to 8), ``resharded`` and ``stopped`` (interrupted, then resumed); interrupted: the interruption."""

    results: dict[str, TrainResult]
    interrupted: Interrupted


@pytest.fixture(scope="module")
def runs(tmp: Path) -> Runs:
    """Three launches: the first runs, the interrupted run, every resumed run."""
    whole = [TrainJob(GRAPH, p, _config(tmp, f"{n}-whole", 8), return_state_dict=True) for n, p in PLANS.items()]
    first = [TrainJob(GRAPH, p, _config(tmp, n, 4)) for n, p in PLANS.items()]
    unbroken = train_many(whole + first)[: len(PLANS)]
    with pytest.raises(Interrupted) as info:
        train_many([TrainJob(GRAPH, PLANS["pipedream"], _config(tmp, "stopped", 8, fault=STOP))])
    second = [TrainJob(GRAPH, p, _config(tmp, f"{n}-resumed", 8, resume=tmp / n), return_state_dict=True)
              for n, p in PLANS.items()]
    second.append(TrainJob(GRAPH, RESHARDED, _config(tmp, "resharded", 8, resume=tmp / "2bw"), return_state_dict=True))
    second.append(TrainJob(GRAPH, PLANS["pipedream"], _config(tmp, "stopped", 8, resume=tmp / "stopped"),
                           return_state_dict=True))
    resumed = train_many(second)
    names = [*(f"{n}-whole" for n in PLANS), *PLANS, "resharded", "stopped"]
    return Runs(dict(zip(names, [*unbroken, *resumed], strict=True)), info.value)


def _diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", list(PLANS))
def test_resume_equals_an_unbroken_run_and_the_emulator(tmp: Path, runs: Runs, name: str) -> None:
    unbroken, resumed = runs.results[f"{name}-whole"], runs.results[name]
    for key, value in unbroken.state_dict.items():
        assert torch.equal(value, resumed.state_dict[key]), (name, key)
    assert [m.step for m in resumed.metrics] == [4, 5, 6, 7]
    assert [m.loss for m in resumed.metrics] == [m.loss for m in unbroken.metrics[4:]]
    # the unbroken run's checkpoint at 4 (mid-run: a step left pending by clipping is in it) is the short run's
    export_checkpoint(step_folder(tmp / f"{name}-whole", 4), tmp / f"{name}-whole-4.pt")
    export_checkpoint(tmp / name, tmp / f"{name}-4.pt")
    mid, short = (torch.load(tmp / f"{name}{part}-4.pt", weights_only=True) for part in ("-whole", ""))
    assert all(torch.equal(mid[key], short[key]) for key in short)
    config = _config(tmp, name, 8)
    drained = emulate_async(GRAPH, PLANS[name], config, drains=(4,))
    assert _diff(unbroken.state_dict, drained) <= TOL
    assert _diff(drained, emulate_async(GRAPH, PLANS[name], config)) > 100 * TOL  # the drain is visible


def test_resume_onto_another_plan_starts_from_the_saved_weights(tmp: Path, runs: Runs) -> None:
    """2bw's first batch after a drain runs on the newest weights, on every stage: its loss is the
    saved model's loss on batch 4."""
    module = GRAPH.build_module()
    export_checkpoint(tmp / "2bw", tmp / "2bw.pt")
    module.load_state_dict(torch.load(tmp / "2bw.pt", weights_only=True), strict=True)
    config = _config(tmp, "resharded", 8)
    batch = timed_batch(GRAPH, BATCH, 4, config.seed, config.data)
    with torch.no_grad():
        expected = float(job_loss(TrainJob(GRAPH, RESHARDED, config))(module(batch.inputs), batch.targets)) / BATCH
    result = runs.results["resharded"]
    assert [m.step for m in result.metrics] == [4, 5, 6, 7]
    assert result.metrics[0].loss == pytest.approx(expected, abs=1e-5)


def test_interrupt_mid_segment_drains_saves_and_resumes(tmp: Path, runs: Runs) -> None:
    """SIGINT reaches rank 0 during step 5: every rank stops at step 6's barrier, drains what is in
    flight, saves step 6; the resumed run equals the emulator with drains at 4 (a checkpoint) and 6."""
    assert runs.interrupted.step == 6 and runs.interrupted.checkpoint == step_folder(tmp / "stopped", 6)
    assert [m.step for m in runs.results["stopped"].metrics] == [6, 7]
    expected = emulate_async(GRAPH, PLANS["pipedream"], _config(tmp, "stopped", 8), drains=(4, 6))
    assert _diff(runs.results["stopped"].state_dict, expected) <= TOL


@pytest.mark.parametrize("name", list(PLANS))
def test_export_writes_the_trained_model(tmp: Path, runs: Runs, name: str) -> None:
    out = tmp / f"{name}-export.pt"
    checkpoint, tensors, _ = export_checkpoint(tmp / f"{name}-resumed", out)
    assert checkpoint.step == 8
    module = GRAPH.build_module()
    module.load_state_dict(torch.load(out, weights_only=True), strict=True)
    assert tensors == len(module.state_dict())
    for key, value in module.state_dict().items():
        assert torch.equal(value, runs.results[name].state_dict[key]), key
