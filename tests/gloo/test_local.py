"""Method ``local`` (PPLL) on gloo equals local learning run in one process (DESIGN invariant 6).

One launch (``train_many``) runs every case; each checks the pipeline's final parameters, main
network and auxiliary heads, against :func:`emulate_local` after 20 steps: within 1e-5. The
pipeline's evaluation (the main path, no heads) must agree with the emulator's too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan, equal_sizes
from pipetrain.reference.local import LocalRun, emulate_local
from pipetrain.runtime import TrainConfig, TrainJob, TrainResult, train_many
from pipetrain.runtime.job.checkpoint import export_checkpoint

from .models import chain_plan, uneven_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 20
TOL = 1e-5
SGD = TrainConfig(steps=STEPS, warmup_steps=1, lr=0.02, data="digits", progress=False, timeout_s=60)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    stages: int
    aux: str
    config: TrainConfig = SGD
    queue_depth: int = 2


CASES = [
    Case("mlp-2stages-linear", "mlp-digits", 2, "linear"),
    Case("mlp-4stages-dgl-adam", "mlp-digits", 4, "dgl", replace(SGD, optimizer="adam", lr=1e-3)),
    Case("cnn-4stages-infopro", "cnn-digits", 4, "infopro", queue_depth=1),
    Case("resnet-2stages-dgl", "resnet-digits", 2, "dgl", replace(SGD, momentum=0.9, lr=0.01)),
    Case("vit-4stages-infopro", "vit-digits", 4, "infopro", replace(SGD, optimizer="adam", lr=1e-3)),
]


def local_plan(case: Case, batch: int = 16, n_micro: int = 4) -> Plan:
    graph = build_model(case.model)
    plan = chain_plan(graph, case.stages, batch, n_micro, Method.LOCAL)
    return replace(plan, weights=WeightPolicy.LOCAL, params=LocalParams(case.aux, case.queue_depth))


def unequal_plan() -> Plan:
    """Each stage cuts the batch its own way (messages are re-chunked by sample range)."""
    graph = build_model("cnn-digits")
    plan = uneven_plan(graph, [(5, 6, 5), equal_sizes(16, 4), (3, 13)])
    return replace(plan, method=Method.LOCAL, weights=WeightPolicy.LOCAL, params=LocalParams("dgl"))


PLANS = {case.name: (case.model, local_plan(case), case.config) for case in CASES}
PLANS["cnn-3stages-unequal"] = ("cnn-digits", unequal_plan(), SGD)


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[TrainResult, LocalRun]]:
    names = list(PLANS)
    jobs = [TrainJob(build_model(PLANS[n][0]), PLANS[n][1], PLANS[n][2], return_state_dict=True) for n in names]
    results = train_many(jobs)
    return {n: (r, emulate_local(build_model(PLANS[n][0]), PLANS[n][1], PLANS[n][2]))
            for n, r in zip(names, results, strict=True)}


@pytest.mark.parametrize("name", list(PLANS))
def test_pipelined_local_learning_equals_the_single_process_emulator(
        name: str, runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    result, emulated = runs[name]
    plan = PLANS[name][1]
    assert set(result.state_dict) == set(emulated.state_dict)
    heads = [k for k in emulated.state_dict if k.startswith("aux")]
    assert {k.split(".")[0] for k in heads} == {f"aux{s}" for s in range(plan.n_stages - 1)}
    diff = max((result.state_dict[k] - v).abs().max().item() for k, v in emulated.state_dict.items())
    assert diff <= TOL, f"{name}: max parameter difference {diff}"
    assert len(result.losses) == STEPS
    assert result.losses == pytest.approx(emulated.losses, rel=1e-6, abs=TOL)
    final = result.final_eval
    assert final is not None and emulated.evaluation is not None
    assert final.eval_accuracy == pytest.approx(emulated.evaluation.accuracy, abs=1e-9)
    assert final.eval_loss == pytest.approx(emulated.evaluation.loss, abs=1e-4)


def test_local_learning_learns_the_digits(runs: dict[str, tuple[TrainResult, LocalRun]]) -> None:
    """20 steps of 16 samples: far above chance (0.1) on the main path alone."""
    final = runs["mlp-2stages-linear"][0].final_eval
    assert final is not None and final.eval_accuracy is not None and final.eval_accuracy > 0.5


def test_checkpoints_carry_the_heads_and_export_leaves_them_out(tmp_path: Path) -> None:
    """6 steps straight = 3 steps, a checkpoint, 3 resumed steps (heads and Adam state included);
    the export is the main network under the model's names (cnn-digits has no buffers), equal to the
    trained one; --with-heads adds the heads."""
    case = Case("resume", "cnn-digits", 2, "dgl", replace(SGD, optimizer="adam", lr=1e-3, steps=6))
    graph, plan = build_model(case.model), local_plan(case)
    half = replace(case.config, steps=3, checkpoint_dir=tmp_path / "ck")
    straight, first = train_many([TrainJob(graph, plan, case.config, return_state_dict=True),
                                  TrainJob(graph, plan, half)])
    resumed = replace(case.config, checkpoint_dir=tmp_path / "ck", resume=tmp_path / "ck")
    second = train_many([TrainJob(graph, plan, resumed, return_state_dict=True)])[0]
    assert set(second.state_dict) == set(straight.state_dict)
    assert any(k.startswith("aux0.") for k in straight.state_dict)
    assert max((second.state_dict[k] - v).abs().max().item() for k, v in straight.state_dict.items()) <= TOL
    _, main, _ = export_checkpoint(tmp_path / "ck", tmp_path / "main.pt")
    state = torch.load(tmp_path / "main.pt")
    assert set(state) == {k for k in straight.state_dict if not k.startswith("aux")}
    assert max((v - straight.state_dict[k]).abs().max().item() for k, v in state.items()) <= TOL  # step 6
    _, everything, _ = export_checkpoint(tmp_path / "ck", tmp_path / "all.pt", with_heads=True)
    heads = {k for k in torch.load(tmp_path / "all.pt") if k.startswith("aux0.")}
    assert heads and everything == main + len(heads) and len(first.losses) == 3
