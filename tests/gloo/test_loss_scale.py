"""fp16 loss scaling in a pipeline (issue 28; :mod:`pipetrain.runtime.job.loss_scale`).

A fake overflow (``FaultInjection(kind="overflow")``: an inf in one gradient of ONE rank's stages at
step 2's STEP) must make every stage skip that step: the run's weights then equal a run of the first
two steps exactly, the loss scale halves (2**16 → 2**15) on the rank that reports the metrics and on
rank 0, which writes it into the checkpoint's manifest. Twice: 1f1b on 2 ranks with the overflow on
rank 0 (the metrics come from rank 1), and interleaved (2 stages per rank, decided at each rank's first
STEP) with the overflow on rank 1 (the manifest comes from rank 0). Without an overflow, fp16 training
equals :func:`reference_train` at fp16 within 2e-5 (measured 5.3e-6: float16 keeps 11 bits of
mantissa, so the rounding differences of bf16's test are 8× smaller), with clipping too (of the
unscaled gradients). A run resuming the overflow run's checkpoint goes on at the halved scale.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, reference_train, train_many
from pipetrain.runtime.job import rank_checkpoint
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.config import FaultInjection
from pipetrain.runtime.job.loss_scale import LossScaler

from .models import chain_plan, max_param_diff, mlp_graph
from .test_precision import looping_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BATCH = 12
GRAPH = mlp_graph(n_blocks=7)
FP16 = TrainConfig(steps=2, warmup_steps=1, lr=0.05, progress=False, timeout_s=60, precision="fp16")
PLANS = {"1f1b": (chain_plan(GRAPH, 2, BATCH, 4, Method.ONE_F_ONE_B), 0),  # plan, the rank that overflows
         "interleaved": (looping_plan(GRAPH, Method.INTERLEAVED), 1)}
START = LossScaler().scale
CLIPPED = replace(FP16, clip_grad_norm=0.05)  # below the gradients' norm: every step clips


def _overflowing(config: TrainConfig, rank: int, folder: Path) -> TrainConfig:
    return replace(config, steps=3, fault=FaultInjection(rank, 2, "overflow"), checkpoint_dir=folder)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainResult]:
    jobs = {}
    for name, (plan, rank) in PLANS.items():
        jobs[f"{name}-2steps"] = TrainJob(GRAPH, plan, FP16, return_state_dict=True)
        folder = tmp_path_factory.mktemp(name)
        jobs[f"{name}-overflow"] = TrainJob(GRAPH, plan, _overflowing(FP16, rank, folder), return_state_dict=True)
    jobs["1f1b-clip"] = TrainJob(GRAPH, PLANS["1f1b"][0], CLIPPED, return_state_dict=True)
    return dict(zip(jobs, train_many(list(jobs.values())), strict=True))


@pytest.mark.parametrize("name", list(PLANS))
def test_overflow_on_one_stage_skips_the_step_everywhere(results: dict[str, TrainResult], name: str) -> None:
    short, skipped = results[f"{name}-2steps"], results[f"{name}-overflow"]
    assert skipped.skipped_steps == (2,) and short.skipped_steps == ()
    assert [m.loss_scale for m in skipped.metrics] == [START, START, START / 2]
    assert set(skipped.state_dict) == set(short.state_dict)
    assert all(torch.equal(skipped.state_dict[k], v) for k, v in short.state_dict.items())


@pytest.mark.parametrize("name", list(PLANS))
def test_checkpoint_keeps_the_scale_of_every_rank(results: dict[str, TrainResult], name: str,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 0 writes the manifest: its scaler halved too, and counted the skipped step."""
    folder = Path(str(tmp_path_factory.getbasetemp())) / f"{name}0"
    (manifest,) = folder.glob("step-*/manifest.json")
    state = json.loads(manifest.read_text())["loss_scale"]
    assert state["scale"] == START / 2 and state["skipped"] == 1 and state["good_steps"] == 0


def test_resume_restores_the_scale(results: dict[str, TrainResult], tmp_path_factory: pytest.TempPathFactory) -> None:
    """A run resuming the 1f1b overflow run's checkpoint starts from its scaler (what each rank reads
    before its first step; read here in the test's process, sparing a launch)."""
    folder = Path(str(tmp_path_factory.getbasetemp())) / "1f1b0"
    plan, _ = PLANS["1f1b"]
    job = check_job(TrainJob(GRAPH, plan, replace(FP16, steps=4, resume=folder)))
    scaler = LossScaler()
    rank_checkpoint.resume_loss_scale(job, scaler)
    assert (scaler.scale, scaler.skipped) == (START / 2, 1)


def test_fp16_equals_reference_fp16(results: dict[str, TrainResult]) -> None:
    reference = reference_train(GRAPH, BATCH, FP16)
    assert max_param_diff(results["1f1b-2steps"], reference) <= 2e-5
    assert reference.metrics[-1].loss_scale == START


def test_fp16_clips_the_unscaled_gradients(results: dict[str, TrainResult]) -> None:
    """Clipping after unscaling, as one process does: clipping the scaled gradients (2**16 times the
    norm) and unscaling them after would leave steps 2**16 times too small."""
    reference = reference_train(GRAPH, BATCH, CLIPPED)
    assert max_param_diff(results["1f1b-clip"], reference) <= 2e-5
    assert max_param_diff(results["1f1b-clip"], results["1f1b-2steps"]) > 1e-3  # the clipping bit
