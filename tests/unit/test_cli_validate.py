"""Every argument is checked before any profiling or probing (issue 32, item 7): a bad one gets one
line and exit code 2 at once. ``api.profile_model`` and the link probe are replaced by functions
that fail the test, which proves nothing was measured first; and ``train`` leaves its folder alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipetrain import api
from pipetrain.cli import main
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.contract import ModelRef
from pipetrain.profile.table import LayerProfile, Profile


@pytest.fixture(autouse=True)
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("profiled or probed before the arguments were checked")

    monkeypatch.setattr(api, "profile_model", measured)
    monkeypatch.setattr("pipetrain.calibrate.overhead.probe_local_cluster", measured)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


TRAIN = ("train", "--model", "mlp-digits", "--steps", "2")
PLAN = ("plan", "--model", "mlp-digits", "--batch", "32")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU")


@pytest.mark.parametrize(("argv", "message"), [
    ((*TRAIN, "--data", "text"), "the text data has byte tokens"),
    ((*TRAIN, "--data", "nosuch"), "data 'nosuch' is unknown"),
    ((*TRAIN, "--data", "text:{tmp}/missing.txt"), "cannot read"),
    ((*TRAIN, "--resume", "{tmp}"), "no whole checkpoint there"),
    ((*TRAIN, "--ranks", "9"), "use at most 4 ranks"),
    ((*TRAIN, "--loss", "mse"), "mse"),
    ((*TRAIN, "--lr", "-1"), "lr"),
    ((*TRAIN, "--profile", "{tmp}/missing.json"), "no profile at"),
    ((*TRAIN, "--estimate", "tpu"), "unknown device model 'tpu'"),
    ((*TRAIN, "--vertical-sync"), "does not take --vertical-sync"),
    ((*TRAIN, "--queue-depth", "3"), "--aux and --queue-depth are for local learning"),
    ((*TRAIN, "--virtual-stages", "2"), "--virtual-stages is for --method"),
    pytest.param((*TRAIN, "--device", "cuda"), "torch sees no GPU", marks=NO_GPU),
    ((*PLAN, "--data", "text"), "the text data has byte tokens"),
    ((*PLAN, "--loss", "nosuch"), "nosuch"),
    ((*PLAN, "--micro", "64"), "cannot split a batch of 32 into 64 micro-batches"),
    ((*PLAN, "--ranks", "2", "--stages", "3"), "3 stages need 3 ranks"),
    ((*PLAN, "--ranks", "2", "--method", "dualpipev", "--micro", "2"), "give --micro 4 or more"),
    ((*PLAN, "--cluster", "{tmp}/missing.yaml"), "no cluster at"),
    (("profile", "--model", "mlp-digits", "--data", "text"), "the text data has byte tokens"),
    (("profile", "--model", "mlp-digits", "--estimate", "tpu"), "unknown device model 'tpu'"),
    pytest.param(("profile", "--model", "mlp-digits", "--device", "cuda"), "torch sees no GPU", marks=NO_GPU),
    (("probe", "--model", "mlp-digits", "--data", "text"), "the text data has byte tokens"),
    (("probe", "--calibrate"), "add --model"),
])
def test_a_bad_argument_fails_before_measuring(argv: tuple[str, ...], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    where = ("--out-dir" if argv[0] == "train" else "--out", str(out))
    code, text = run(capsys, *(a.format(tmp=tmp_path) for a in argv), *where)
    assert code == 2 and message in text, text
    assert not out.exists()  # train claimed no folder, nothing was written


def _profile(names: tuple[str, ...], batch: int) -> Profile:
    """A made-up profile of layers ``names`` whose costs grow with the micro-batch size (nothing
    measured, no fingerprint: building the model's modules to take one costs seconds)."""
    layers = tuple(LayerProfile(name, (1, batch), (1e-4, 1e-3), (2e-4, 2e-3), 256, 1024, 4096, 1e5) for name in names)
    return Profile("mlp-digits", "", "cpu", "synthetic", batch, layers)


def test_simulate_checks_its_flags_before_re_cutting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`simulate --virtual-stages` re-cuts the plan on a profile: a flag of another method is refused first."""
    graph = build_model("mlp-digits")
    plan = Plan.from_json(json.dumps({
        "model": graph.name, "batch_size": 8, "method": "1f1b",
        "stages": [{"layers": list(graph.names[:2]), "ranks": [0], "forward_sizes": [4, 4]},
                   {"layers": list(graph.names[2:]), "ranks": [1], "forward_sizes": [4, 4]}]}))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    code, text = run(capsys, "simulate", "--plan", str(path), "--method", "interleaved", "--virtual-stages", "2",
                     "--aux", "linear", "--out-dir", str(tmp_path / "sim"))
    assert code == 2 and "--aux and --queue-depth are for local learning" in text


def test_method_auto_is_the_old_spelling_of_no_method(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "plan", "--method", "auto", "--print-config")
    assert code == 0 and "method:" not in text and "--method auto is deprecated" in text
    code, text = run(capsys, "plan", "--print-config")
    assert code == 0 and "method:" not in text and "deprecated" not in text


def test_the_interleaved_planner_names_too_few_microbatches() -> None:
    """The API's way to the same mistake: DualPipeV with fewer micro-batches than stages."""
    model = ModelRef("mlp-digits", "", build_model("mlp-digits").names)
    with pytest.raises(UserError, match="needs a micro-batch per stage, at least 4 on 2 ranks, not 2"):
        api.plan(model, _profile(model.layer_names, 32), api.local_cluster(2), batch_size=32,
                 constraints=api.Constraints(method=Method.DUALPIPEV, n_micro=2))
