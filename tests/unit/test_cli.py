"""The CLI: the plan → simulate → compare path, and user mistakes (one line, exit code 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.cluster import Cluster
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.microbatch import GA_PLANNERS, PLANNER_NAMES
from pipetrain.planners.microbatch.uedp import ALGORITHMS
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.timeline import Timeline


@pytest.fixture
def tiny_profile(tmp_path: Path) -> Path:
    """A synthetic profile of gpt-tiny: cost grows with the micro-batch size."""
    graph = build_model("gpt-tiny")
    layers = tuple(
        LayerProfile(name, (1, 32), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6) for name in graph.names
    )
    profile = Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers)
    path = tmp_path / "profile.json"
    profile.save(path)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_plan_simulate_compare(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2",
                     "--profile", str(tiny_profile), "--out", str(plan))
    assert code == 0, text
    assert "planners (auto keeps the fastest that fits" in text and plan.exists()  # the default: auto
    sim = tmp_path / "sim"
    code, text = run(capsys, "simulate", "--plan", str(plan), "--profile", str(tiny_profile), "--out-dir", str(sim))
    assert code == 0, text
    for name in ("predicted.json", "predicted_trace.json", "predicted.png", "schedule.csv"):
        assert (sim / name).stat().st_size > 0, name
    assert json.loads((sim / "predicted_trace.json").read_text())["traceEvents"]
    timeline = Timeline.load(sim / "predicted.json")
    assert timeline.n_ranks == 2 and timeline.iteration_s > 0
    picture = tmp_path / "cmp.png"
    measured = tmp_path / "measured.json"
    dataclasses.replace(timeline, kind="measured").save(measured)
    code, text = run(capsys, "compare", "--plan", str(plan), "--predicted", str(sim / "predicted.json"),
                     "--measured", str(measured), "--out", str(picture))
    assert code == 0, text
    assert picture.stat().st_size > 5000
    code, text = run(capsys, "compare", "--plan", str(plan), "--predicted", str(measured),
                     "--measured", str(sim / "predicted.json"), "--out", str(picture))
    assert code == 2 and "--predicted is a measured timeline" in text
    dataclasses.replace(timeline, kind="measured", n_ranks=3).save(measured)
    code, text = run(capsys, "compare", "--plan", str(plan), "--predicted", str(sim / "predicted.json"),
                     "--measured", str(measured), "--out", str(picture))
    assert code == 2 and "--measured has 3 ranks but the plan 2" in text


def write_plan(tmp_path: Path, **changes: object) -> Path:
    graph = build_model("gpt-tiny")
    plan = {
        "model": "gpt-tiny", "model_fingerprint": graph.fingerprint(), "batch_size": 8, "method": "gpipe",
        "stages": [
            {"layers": list(graph.names[:3]), "ranks": [0], "forward_sizes": [4, 4]},
            {"layers": list(graph.names[3:]), "ranks": [1], "forward_sizes": [4, 4]},
        ],
    }
    plan.update(changes)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "nosuch"], "unknown model 'nosuch'"),
        (["plan", "--model", "gpt-tiny", "--ranks", "9", "--profile", "{profile}"], "use at most 6 ranks"),
        (["plan", "--model", "gpt-tiny", "--ranks", "2", "--stages", "3", "--profile", "{profile}", "--no-probe"],
         "3 stages need 3 ranks"),
        (["simulate", "--plan", "{tmp}/missing.json", "--profile", "{profile}"], "no file at"),
        (["plan", "--model", "gpt-tiny", "--profile", "{tmp}/missing.json"], "no profile at"),
        (["simulate", "--plan", "{plan}", "--profile", "{profile}", "--out-dir", "{plan}"], "File exists"),
        (["simulate", "--plan", "{plan}", "--profile", "{profile}", "--out-dir", "/proc/pipetrain-out"],
         "No such file or directory"),
        (["train", "--plan", "{plan}", "--model", "mlp"], "drop --model"),
    ],
)
def test_user_mistakes_exit_2(
    argv: list[str], message: str, tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path)
    args = [a.format(profile=tiny_profile, tmp=tmp_path, plan=plan) for a in argv]
    code, text = run(capsys, *args)
    assert code == 2
    assert message in text
    assert text.strip().startswith("error:")


@pytest.mark.parametrize("command", ["simulate", "train", "demo"])
def test_out_of_a_folder_command_names_out_dir(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--out is always one file; the commands that write several files take --out-dir (one error line)."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--out", "sim"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("writes several files into a folder: use --out-dir sim"), error


def test_malformed_plan_json(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "gpt-tiny", "batch_size": ')
    code, text = run(capsys, "simulate", "--plan", str(bad), "--profile", str(tiny_profile))
    assert code == 2 and "not valid JSON" in text


def test_sizes_not_summing(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path, stages=[
        {"layers": ["embed", "block0", "block1"], "ranks": [0], "forward_sizes": [4, 3]},
        {"layers": ["block2", "block3", "head"], "ranks": [1], "forward_sizes": [4, 3]},
    ])
    code, text = run(capsys, "simulate", "--plan", str(plan), "--profile", str(tiny_profile))
    assert code == 2
    assert "stage 0: forward micro-batch sizes [4, 3] sum to 7 but the batch has 8 samples" in text


def test_plan_for_another_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path, model_fingerprint="0000000000000000")
    code, text = run(capsys, "train", "--plan", str(plan), "--steps", "1", "--out-dir", str(tmp_path / "run"))
    assert code == 2 and "made for another model" in text


def test_plan_layers_do_not_match_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = write_plan(tmp_path, model_fingerprint="", stages=[
        {"layers": ["embed", "block0"], "ranks": [0], "forward_sizes": [8]},
        {"layers": ["head"], "ranks": [1], "forward_sizes": [8]},
    ])
    code, text = run(capsys, "train", "--plan", str(plan), "--steps", "1", "--out-dir", str(tmp_path / "run"))
    assert code == 2 and "missing 'block1'" in text


# ---- plan --method uedp ---------------------------------------------------------------------------

UEDP = ("plan", "--model", "gpt-tiny", "--batch", "32", "--ranks", "2", "--method", "uedp")
TINY_GA = ("--population", "8", "--generations", "4")


def plan_file(capsys: pytest.CaptureFixture[str], out: Path, *argv: str) -> tuple[Plan, str]:
    code, text = run(capsys, *argv, "--out", str(out))
    assert code == 0, text
    return Plan.from_json(out.read_text()), text


@pytest.fixture
def gpipe_plan(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> Plan:
    """The best GPipe plan: the flush-order equal plan that uedp planners start from (same stages)."""
    plan, _ = plan_file(capsys, tmp_path / "gpipe.json", "plan", "--model", "gpt-tiny", "--batch", "32",
                        "--ranks", "2", "--method", "gpipe", "--profile", str(tiny_profile))
    return plan


@pytest.mark.parametrize("planner", PLANNER_NAMES)
def test_plan_uedp_each_planner(
    planner: str, tmp_path: Path, tiny_profile: Path, gpipe_plan: Plan, capsys: pytest.CaptureFixture[str]
) -> None:
    ga = TINY_GA if planner in GA_PLANNERS else ()
    plan, text = plan_file(capsys, tmp_path / "plan.json", *UEDP, "--planner", planner, *ga,
                           "--profile", str(tiny_profile))
    graph = build_model("gpt-tiny")
    plan.validate(graph.names, graph.fingerprint())
    expected = ALGORITHMS[planner].method  # unequal 1F1B and ZB-H1: pipetrain's extensions
    kept = "found nothing faster than the best equal plan" in text  # then the equal plan is what was saved
    assert (plan.method is expected) != kept and plan.prediction is not None
    if planner != "interleaved-ga":  # that one keeps the interleaved planner's stages, v per rank
        assert [s.layers for s in plan.stages] == [s.layers for s in gpipe_plan.stages]
    assert ("speedup" in text and "count F/B" in text) or kept
    if planner in ("equal", "dgap", "tidgap", "single"):  # seeded with the equal flush-order plans: never slower
        assert gpipe_plan.prediction is not None
        assert plan.prediction.iteration_s <= gpipe_plan.prediction.iteration_s * (1 + 1e-12)
    assert ("generations" in text) == (planner in GA_PLANNERS)  # the GA's progress bar


def test_plan_uedp_virtual_stages_plans_interleaved_ga(
    tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--method uedp --virtual-stages V``: unequal micro-batches per virtual stage of an interleaved
    plan with V chunks per rank (the interleaved-ga planner), V·R stages in looping placement."""
    plan, text = plan_file(capsys, tmp_path / "plan.json", *UEDP, "--virtual-stages", "3", *TINY_GA,
                           "--profile", str(tiny_profile))
    assert plan.method is Method.INTERLEAVED and plan.virtual_stages == 3 and len(plan.stages) == 2 * 3
    assert [s.ranks for s in plan.stages] == [(k % 2,) for k in range(6)]
    assert "interleaved-ga" in text
    build = build_model("gpt-tiny")
    plan.validate(build.names, build.fingerprint())


@pytest.mark.parametrize(("extra", "message"), [
    (("--virtual-stages", "1"), "one model chunk per rank: drop it"),
    (("--virtual-stages", "2", "--planner", "tidgap"), "with the interleaved-ga planner, not --planner tidgap"),
    (("--virtual-stages", "2", "--planner", "auto"), "--planner auto already tries them"),
])
def test_plan_uedp_virtual_stages_errors(
    extra: tuple[str, ...], message: str, tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = run(capsys, *UEDP, "--profile", str(tiny_profile), *extra)
    assert code == 2 and message in text, text


def test_plan_uedp_default_planner_is_deterministic(
    tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = (*UEDP, "--profile", str(tiny_profile), "--population", "12", "--generations", "6", "--seed", "3")
    _, text = plan_file(capsys, tmp_path / "a" / "plan.json", *argv)
    assert "tidgap (seed 3)" in text
    plan_file(capsys, tmp_path / "b" / "plan.json", *argv)
    assert (tmp_path / "a" / "plan.json").read_text() == (tmp_path / "b" / "plan.json").read_text()


def test_plan_uedp_memory_cap(tmp_path: Path, tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny_profile, 3 layers a stage: state 2 × 3 × 4096 B, saved 3 × 16384 B a sample, inputs 128 B
    # (stage 0) and 8192 B (stage 1) a sample: 1 MiB caps the micro-batches at 20 and 15 samples.
    cluster = tmp_path / "cluster.json"
    Cluster.local(2, memory_bytes=2**20).save(cluster)
    plan, text = plan_file(capsys, tmp_path / "plan.json", *UEDP, "--profile", str(tiny_profile),
                           "--cluster", str(cluster), *TINY_GA)
    assert "largest/cap" in text and "within memory" in text
    assert plan.recompute_stages == (0, 1)  # the whole batch's activations fit neither stage
    for stage, cap in zip(plan.stages, (20, 15), strict=True):
        assert max(*stage.forward_sizes, *stage.backward_sizes) <= cap
    Cluster.local(2, memory_bytes=50_000).save(cluster)
    code, text = run(capsys, *UEDP, "--profile", str(tiny_profile), "--cluster", str(cluster), *TINY_GA)
    assert code == 2 and text.strip().startswith("error: stage 0 (embed … block1, rank 0) needs")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--planner", "tidgap"), "--planner is for UMPIPE's unequal micro-batches: add --method uedp"),
        (("--seed", "1", "--generations", "5"), "--seed, --generations are for UMPIPE's"),
        (("--method", "gpipe", "--planner", "dp"), "add --method uedp (--method is gpipe)"),
        (("--method", "uedp", "--planner", "dp", "--population", "8"), "only apply to the GA planners"),
        (("--method", "uedp", "--population", "2"), "bad GA settings"),
    ],
)
def test_plan_uedp_options_need_uedp(
    extra: tuple[str, ...], message: str, tiny_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = run(capsys, "plan", "--model", "gpt-tiny", "--profile", str(tiny_profile), *extra)
    assert code == 2, text
    assert message in text and text.strip().startswith("error:")


def test_unknown_flag_suggests_the_near_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--stpes", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized argument --stpes; did you mean --steps?" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("pipetrain ")


def test_export_writes_the_newest_checkpoints_state_dict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from pipetrain.runtime.job.checkpoint import stage_state, write_manifest, write_shard

    graph = build_model("mlp")
    module = graph.build_sequential()
    entry = write_shard(tmp_path / "ckpt", 5, 0, stage_state(module, graph.layers, None, owner=True))
    write_manifest(tmp_path / "ckpt", 5, [entry], {"model": graph.name}, None)
    code, text = run(capsys, "export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "model.pt"))
    assert code == 0, text
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert f"exported {graph.name} after step 5" in text and f"{len(state)} tensors" in text
    graph.build_module().load_state_dict(state, strict=True)
    code, text = run(capsys, "export", "--checkpoint", str(tmp_path / "none"))
    assert code == 2 and "no whole checkpoint in" in text
