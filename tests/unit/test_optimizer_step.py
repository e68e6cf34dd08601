"""Optimizer-aware STEP (issue 32): per-optimizer steps in the profile, the cost model pricing the
plan's optimizer and clipping, the plan recording them, and ``plan``/``simulate``/``train`` using them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import pipetrain.runtime
from pipetrain import api
from pipetrain.cli import main
from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.profile.optimizer_step import OPTIMIZER_NAMES, STEP_PASSES, time_clip, time_steps
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.profile.timing import _Timer
from pipetrain.runtime import TrainConfig, TrainResult
from pipetrain.schedule.action import ActionKind
from pipetrain.simulate.timeline import Timeline

_STEPS = {"sgd-momentum": 2e-3, "adam": 5e-3, "adamw": 6e-3}


def _profile(*, measured: bool = True) -> Profile:
    """Two layers of 1 MB parameters; measured: SGD 1 ms, the others :data:`_STEPS`, clipping 0.5 ms."""
    layers = tuple(
        LayerProfile(name, (1, 4), (1.0, 2.0), (2.0, 4.0), 100, 10, 1_000_000, 5.0,
                     1e-3 if measured else None, optimizer_step_s=dict(_STEPS) if measured else {},  # type: ignore[arg-type]
                     clip_s=5e-4 if measured else None)
        for name in ("a", "b"))
    return Profile("m", "", "cpu", "test", 50, layers)


def test_profile_json_round_trips_the_optimizers_steps() -> None:
    profile = _profile()
    again = Profile.from_json(profile.to_json())
    assert again == profile
    assert [again.layers[0].step_for(name) for name in OPTIMIZER_NAMES] == [1e-3, 2e-3, 5e-3, 6e-3]
    assert again.layers[0].clip_for() == 5e-4


def test_an_old_profile_holds_sgd_and_scales_the_others() -> None:
    data = json.loads(_profile().to_json())
    for layer in data["layers"]:
        del layer["optimizer_step_s"], layer["clip_s"]  # as written before the other optimizers were timed
    old = Profile.from_json(json.dumps(data)).layers[0]
    assert old.step_for("sgd") == 1e-3
    assert old.step_for("adamw") == pytest.approx(1e-3 * STEP_PASSES["adamw"] / STEP_PASSES["sgd"])
    assert old.clip_for() == pytest.approx(1e-3)  # 3 passes, as SGD's
    estimated = _profile(measured=False).layers[0]
    assert estimated.step_for("adam") is None and estimated.clip_for() is None


def test_profile_json_refuses_an_unknown_optimizer() -> None:
    data = json.loads(_profile().to_json())
    data["layers"][0]["optimizer_step_s"] = {"lamb": 1e-3}
    with pytest.raises(UserError, match="SGD's is step_s"):
        Profile.from_json(json.dumps(data))


def test_cost_model_prices_the_optimizer_and_clipping() -> None:
    cluster = Cluster.local(2, link=Link(1e-3, 1e9))
    stage = ("a", "b")
    for profile in (_profile(), _profile(measured=False)):  # measured, and memory-bound
        sgd, adamw = (CostModel(profile, cluster, optimizer=name).step_s(stage, 0) for name in ("sgd", "adamw"))
        clipping = CostModel(profile, cluster, optimizer="adamw", clip_grad_norm=True)
        assert adamw > sgd > 0
        assert clipping.step_s(stage, 0) > adamw  # the norm's read and the scaling
        assert clipping.clip_allreduce_s([0, 1]) == pytest.approx(clipping.allreduce_s(8, [0, 1]))
        assert clipping.on(Cluster.local(3)).clip_grad_norm and clipping.on(Cluster.local(3)).optimizer == "adamw"
    assert CostModel(_profile(), cluster, optimizer="adamw").step_s(stage, 0) == pytest.approx(2 * 6e-3)
    assert CostModel(_profile(), cluster).clip_allreduce_s([0, 1]) == 0.0


def _two_stage_plan(**fields: object) -> Plan:
    stages = tuple(StagePlan((name,), (k,), (2, 2), (2, 2)) for k, name in enumerate(("a", "b")))
    return replace(Plan("m", "", 4, Method.ONE_F_ONE_B, stages), **fields)  # type: ignore[arg-type]


def test_prediction_adds_the_clipping_all_reduce_to_every_ranks_step() -> None:
    cluster = Cluster.local(2, link=Link(1e-3, 1e9))
    plain, clipped = (api.predict(_two_stage_plan(optimizer="adamw", clip_grad_norm=clip), _profile(), cluster)[1]
                      for clip in (False, True))

    def steps(timeline: Timeline) -> list[float]:
        return [e.duration_s for e in timeline.events if e.action.kind is ActionKind.STEP]

    extra = CostModel(_profile(), cluster, clip_grad_norm=True).clip_allreduce_s([0, 1]) + 5e-4
    assert steps(plain) == pytest.approx([6e-3, 6e-3])
    assert steps(clipped) == pytest.approx([6e-3 + extra] * 2)


def test_plan_json_writes_the_optimizer_only_when_not_the_default() -> None:
    plan = _two_stage_plan(optimizer="adamw", clip_grad_norm=True)
    data = json.loads(plan.to_json())
    assert (data["optimizer"], data["clip_grad_norm"]) == ("adamw", True)
    assert Plan.from_json(plan.to_json()) == plan
    old = json.loads(_two_stage_plan().to_json())
    assert "optimizer" not in old and "clip_grad_norm" not in old  # as plans were written before
    assert (Plan.from_json(json.dumps(old)).optimizer, Plan.from_json(json.dumps(old)).clip_grad_norm) == ("sgd", False)
    with pytest.raises(UserError, match="lamb"):
        Plan.from_json(json.dumps({**data, "optimizer": "lamb"}))
    with pytest.raises(UserError, match="true or false"):
        Plan.from_json(json.dumps({**data, "clip_grad_norm": "yes"}))


def test_api_plan_records_and_prices_the_optimizer() -> None:
    graph = build_model("mlp-digits")
    layers = tuple(LayerProfile(name, (1, 8), (1e-4, 8e-4), (2e-4, 16e-4), 256, 512, 1_000_000, 1e6)
                   for name in graph.names)  # no step measured: memory-bound on the V100
    profile = Profile(graph.name, graph.fingerprint(), "v100", "estimated", 256, layers)
    cluster, _ = api.estimated_cluster("v100", 2)
    plans = {name: api.plan(graph, profile, cluster, batch_size=8, optimizer=name, clip_grad_norm=name == "adamw",
                            constraints=api.Constraints(method=Method.GPIPE, n_micro=2)).plan
             for name in ("sgd", "adamw")}
    assert (plans["adamw"].optimizer, plans["adamw"].clip_grad_norm) == ("adamw", True)
    assert (plans["sgd"].optimizer, plans["sgd"].clip_grad_norm) == ("sgd", False)
    cost = api.cost_of(plans["adamw"], profile, cluster)
    assert (cost.optimizer, cost.clip_grad_norm) == ("adamw", True)
    times = {name: api.predict(plan, profile, cluster)[1].iteration_s for name, plan in plans.items()}
    assert times["adamw"] > times["sgd"]


def test_the_profiler_times_every_optimizer() -> None:
    layer = nn.Linear(64, 64)
    layer(torch.randn(4, 64)).sum().backward()
    timer = _Timer(torch.device("cpu"), 1, 2)
    steps = time_steps(timer, layer)
    assert set(steps) == set(OPTIMIZER_NAMES) and all(s > 0 for s in steps.values())
    assert time_clip(timer, layer) > 0 and time_steps(timer, nn.ReLU()) == dict.fromkeys(OPTIMIZER_NAMES, 0.0)


@pytest.fixture
def tiny_profile(tmp_path: Path) -> Path:
    """A synthetic profile of gpt-tiny with SGD's step measured alone (an older profile)."""
    graph = build_model("gpt-tiny")
    layers = tuple(LayerProfile(name, (1, 32), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6, 1e-4)
                   for name in graph.names)
    path = tmp_path / "profile.json"
    Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers).save(path)
    return path


def test_cli_plan_writes_the_optimizer_simulate_and_train_say_when_they_differ(
    tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt-tiny", "--batch", "16", "--ranks", "2", "--profile", str(tiny_profile),
                 "--method", "1f1b", "--optimizer", "adamw", "--clip-grad-norm", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["optimizer"], data["clip_grad_norm"]) == ("adamw", True)
    capsys.readouterr()

    simulate = ["simulate", "--plan", str(out), "--profile", str(tiny_profile), "--out-dir", str(tmp_path / "sim")]
    assert main(simulate) == 0
    assert "not the plan's" not in capsys.readouterr().out
    assert main([*simulate, "--optimizer", "sgd"]) == 0
    assert "pricing the step and memory of sgd (--optimizer), not the plan's adamw" in capsys.readouterr().out

    def fake_train(graph: object, plan: Plan, config: TrainConfig, **_: object) -> TrainResult:
        raise UserError("not launched")

    monkeypatch.setattr(pipetrain.runtime, "train", fake_train)
    main(["train", "--plan", str(out), "--steps", "2", "--out-dir", str(tmp_path / "run")])
    assert "training with sgd, but the plan's prediction priced the step of adamw with clipping" \
        in capsys.readouterr().out
    main(["train", "--plan", str(out), "--optimizer", "adamw", "--clip-grad-norm", "1", "--steps", "2",
          "--out-dir", str(tmp_path / "run"), "--overwrite"])
    assert "training with" not in capsys.readouterr().out
