"""Property tests of the CLI (issue 13): whatever numbers the options get and however the plan,
profile, cluster and timeline files are mangled, a command either succeeds (exit 0) or exits 2 with
one ``error:`` line; never a traceback.

Training is never launched: ``launch_local`` is replaced by a stub, so ``train`` runs every check it
makes before starting ranks and then counts as a success.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipetrain.cli import main
from pipetrain.cluster import Cluster
from pipetrain.graph.zoo import build_model
from pipetrain.profile.table import LayerProfile, Profile

# PIPETRAIN_PROPERTY_EXAMPLES=500 explores further (random, not derandomized) for a long hunt
EXAMPLES = int(os.environ.get("PIPETRAIN_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 25, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class _Launched(Exception):
    """Raised by the stub launcher: training would start here (the arguments passed every check)."""


@dataclass(frozen=True)
class Files:
    folder: Path
    profile: Path
    plan: Path
    predicted: Path
    measured: Path
    cluster_json: Path
    cluster_yaml: Path


CLUSTER_YAML = """\
name: two-v100
groups:
  - {device: v100, count: 2, per_node: 1, memory_gib: 16}
links:
  intra_node: {latency_us: 10, bandwidth_gb_per_s: 45}
  inter_node: {latency_us: 20, bandwidth_gbit_per_s: 25}
"""


def outcome(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> tuple[int, str]:
    """Run the CLI in-process; exit code and everything it printed. Any exception other than
    argparse's SystemExit propagates (a crash is what these tests look for)."""
    try:
        code: Any = main(list(argv))
    except SystemExit as e:
        code = e.code
    except _Launched:
        code = 0
    finally:
        captured = capsys.readouterr()
    return int(code or 0), captured.out + captured.err


def assert_clean(code: int, text: str, argv: Sequence[str]) -> None:
    """Exit 0, or exit 2 with exactly one ``error:`` line (the last line, or argparse's usage + error)."""
    assert "Traceback" not in text, (argv, text)
    assert code in (0, 2), (argv, code, text)
    if code == 0:
        return
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    usage_errors = [line for line in lines if line.startswith("pipetrain ") and ": error:" in line]
    if usage_errors:  # argparse: usage lines, then "pipetrain <command>: error: ..."
        assert lines[0].startswith("usage:"), (argv, text)
        assert len(usage_errors) == 1 and not errors and lines[-1] == usage_errors[0], (argv, text)
    else:
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, text)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    """A profile (synthetic, of gpt-tiny), a plan, its predicted and measured timelines and two clusters."""
    folder = tmp_path_factory.mktemp("cli-properties")
    graph = build_model("gpt-tiny")
    layers = tuple(
        LayerProfile(name, (1, 32), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6) for name in graph.names
    )
    profile = folder / "profile.json"
    Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers).save(profile)
    plan, sim = folder / "plan.json", folder / "sim"
    assert main(["plan", "--model", "gpt-tiny", "--batch", "8", "--ranks", "2", "--method", "gpipe",
                 "--profile", str(profile), "--out", str(plan)]) == 0
    assert main(["simulate", "--plan", str(plan), "--profile", str(profile), "--out-dir", str(sim)]) == 0
    predicted = sim / "predicted.json"
    measured = folder / "measured.json"
    data = json.loads(predicted.read_text())
    data["kind"] = "measured"
    measured.write_text(json.dumps(data))
    cluster_json = folder / "cluster.json"
    Cluster.local(2).save(cluster_json)
    cluster_yaml = folder / "cluster.yaml"
    cluster_yaml.write_text(CLUSTER_YAML)
    return Files(folder, profile, plan, predicted, measured, cluster_json, cluster_yaml)


@pytest.fixture
def no_launch() -> Iterator[None]:
    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=_Launched):
        yield


# ---- numeric options -------------------------------------------------------------------------

ODD_TEXT = ["0", "-0", "-1", "1", "2", "3", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "1e-300", "", "abc",
            "1.5", "0.0", "-0.5", "0x10", " 3", "1_000", "10000000000000000000000", "٣", "1e3", "2.0"]


def numbers(*, huge: bool = True) -> st.SearchStrategy[str]:
    """Option values: small integers, huge ones (past any sensible count), any float (nan, inf),
    odd text. Middling integers (a batch of 10 000) are left out: valid, just slow to plan."""
    return st.one_of(
        st.integers(-3, 40).map(str),
        *([st.integers(2**40, 10**30).map(str)] if huge else []),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(ODD_TEXT if huge else [t for t in ODD_TEXT if t not in ("1_000", "10000000000000000000000")]),
    )


PLAN_OPTIONS = ["--batch", "--ranks", "--stages", "--micro", "--top"]
UEDP_OPTIONS = ["--population", "--generations", "--seed"]
TRAIN_OPTIONS = ["--steps", "--epochs", "--lr", "--eval-every", "--warmup-steps", "--clip-grad-norm", "--momentum",
                 "--weight-decay", "--threads", "--timeout", "--keep", "--checkpoint-every", "--seed", "--batch"]


@SETTINGS
@given(option=st.sampled_from(PLAN_OPTIONS), value=numbers(), estimate=st.booleans())
def test_plan_numeric_options(
    files: Files, capsys: pytest.CaptureFixture[str], option: str, value: str, estimate: bool
) -> None:
    costs = ["--estimate", "v100"] if estimate else ["--profile", str(files.profile)]
    argv = ["plan", "--model", "gpt-tiny", "--planner", "balanced", *costs, "--out", str(files.folder / "p.json"),
            f"{option}={value}"]
    assert_clean(*outcome(capsys, argv), argv)


@SETTINGS
@given(option=st.sampled_from(UEDP_OPTIONS), data=st.data())
def test_plan_uedp_numeric_options(
    files: Files, capsys: pytest.CaptureFixture[str], option: str, data: st.DataObject
) -> None:
    value = data.draw(numbers(huge=option == "--seed"))
    # a huge population or generation count is valid, it just runs for as long as asked
    small = {"--population": "8", "--generations": "4"}
    small.pop(option, None)
    argv = ["plan", "--model", "gpt-tiny", "--batch", "8", "--method", "uedp", "--planner", "1f1b-ga",
            "--profile", str(files.profile), "--out", str(files.folder / "u.json"),
            *(x for kv in small.items() for x in kv), f"{option}={value}"]
    assert_clean(*outcome(capsys, argv), argv)


@SETTINGS
@given(option=st.sampled_from(TRAIN_OPTIONS), value=numbers(), schedule=st.sampled_from(["constant", "warmup-cosine"]))
def test_train_numeric_options(
    files: Files, capsys: pytest.CaptureFixture[str], no_launch: None, option: str, value: str, schedule: str
) -> None:
    argv = ["train", "--plan", str(files.plan), "--data", "synthetic", "--lr-schedule", schedule,
            "--out-dir", str(files.folder / "run"), f"{option}={value}"]
    assert_clean(*outcome(capsys, argv), argv)


@SETTINGS
@given(option=st.sampled_from(["--ranks", "--probes", "--overhead"]), value=numbers())
def test_probe_numeric_options(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    argv = ["probe", f"{option}={value}", "--out", "/nonexistent-dir/cluster.json"]
    with mock.patch("pipetrain.calibrate.overhead.probe_local_cluster", side_effect=_Launched):  # starts ranks
        assert_clean(*outcome(capsys, argv), argv)


@SETTINGS
@given(option=st.sampled_from(["--batch", "--repeats"]), value=numbers())
def test_profile_numeric_options(files: Files, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    argv = ["profile", "--model", "mlp-digits", "--estimate", "v100", "--out", str(files.folder / "prof.json"),
            f"{option}={value}"]
    assert_clean(*outcome(capsys, argv), argv)


@SETTINGS
@given(option=st.sampled_from(["--ranks", "--estimate"]), value=numbers())
def test_simulate_numeric_options(files: Files, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    if option == "--estimate":
        argv = ["simulate", "--plan", str(files.plan), "--out-dir", str(files.folder / "sim-n"), f"--estimate={value}"]
    else:
        argv = ["simulate", "--plan", str(files.plan), "--profile", str(files.profile),
                "--out-dir", str(files.folder / "sim-n"), f"{option}={value}"]
    assert_clean(*outcome(capsys, argv), argv)


# ---- mutated files ---------------------------------------------------------------------------

ODD_VALUES: list[Any] = [None, -1, 0, 1, 10**30, -10**30, math.nan, math.inf, -math.inf, 0.5, -2.5, "x", "", [],
                         {}, True, [1, 2], {"a": 1}]

Where = tuple[Any, ...]


def places(node: Any, prefix: Where = ()) -> list[Where]:
    """Every place in a JSON value: key and index paths, the root included."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += places(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += places(value, (*prefix, i))
    return found


def get(node: Any, where: Where) -> Any:
    for key in where:
        node = node[key]
    return node


@st.composite
def mutated(draw: st.DrawFn, data: Any) -> Any:
    """``data`` with one to three mutations: a key or entry deleted, a value replaced by an odd one,
    a list shuffled, shortened or doubled."""
    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(places(data)))
        kind = draw(st.sampled_from(["delete", "replace", "shuffle", "shorten", "double"]))
        target = get(data, where)
        if kind == "delete" and where:
            del get(data, where[:-1])[where[-1]]
        elif kind in ("shuffle", "shorten", "double") and isinstance(target, list) and target:
            if kind == "shuffle":
                target[:] = draw(st.permutations(target))
            elif kind == "shorten":
                del target[draw(st.integers(0, len(target) - 1))]
            else:
                target += copy.deepcopy(target)
        else:
            value = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
            if where:
                get(data, where[:-1])[where[-1]] = value
            else:
                data = value
    return data


@st.composite
def mutated_json(draw: st.DrawFn, text: str) -> str:
    """A JSON file's text mutated (see :func:`mutated`), or cut short."""
    if draw(st.integers(0, 5)) == 0:
        return text[: draw(st.integers(0, len(text) - 1))]
    return json.dumps(draw(mutated(json.loads(text))))


def check_file(capsys: pytest.CaptureFixture[str], path: Path, text: str, argv: Sequence[str]) -> None:
    path.write_text(text)
    code, output = outcome(capsys, argv)
    assert_clean(code, output, [*argv, text])


@SETTINGS
@given(data=st.data(), command=st.sampled_from(["simulate", "train", "compare"]))
def test_mutated_plan(
    files: Files, capsys: pytest.CaptureFixture[str], no_launch: None, data: st.DataObject, command: str
) -> None:
    text = data.draw(mutated_json(files.plan.read_text()))
    bad = files.folder / "bad-plan.json"
    argv = {
        "simulate": ["simulate", "--plan", str(bad), "--profile", str(files.profile),
                     "--out-dir", str(files.folder / "sim-p")],
        "train": ["train", "--plan", str(bad), "--steps", "2", "--data", "synthetic"],
        "compare": ["compare", "--plan", str(bad), "--predicted", str(files.predicted),
                    "--measured", str(files.measured), "--out", str(files.folder / "cmp-p.png")],
    }[command]
    check_file(capsys, bad, text, argv)


@SETTINGS
@given(data=st.data(), command=st.sampled_from(["plan", "simulate"]))
def test_mutated_profile(files: Files, capsys: pytest.CaptureFixture[str], data: st.DataObject, command: str) -> None:
    text = data.draw(mutated_json(files.profile.read_text()))
    bad = files.folder / "bad-profile.json"
    argv = {
        "plan": ["plan", "--model", "gpt-tiny", "--batch", "8", "--ranks", "2", "--profile", str(bad),
                 "--out", str(files.folder / "p-prof.json")],
        "simulate": ["simulate", "--plan", str(files.plan), "--profile", str(bad),
                     "--out-dir", str(files.folder / "sim-prof")],
    }[command]
    check_file(capsys, bad, text, argv)


@SETTINGS
@given(data=st.data(), command=st.sampled_from(["plan", "simulate"]))
def test_mutated_cluster_json(
    files: Files, capsys: pytest.CaptureFixture[str], data: st.DataObject, command: str
) -> None:
    text = data.draw(mutated_json(files.cluster_json.read_text()))
    bad = files.folder / "bad-cluster.json"
    argv = {
        "plan": ["plan", "--model", "gpt-tiny", "--batch", "8", "--profile", str(files.profile),
                 "--cluster", str(bad), "--out", str(files.folder / "p-cj.json")],
        "simulate": ["simulate", "--plan", str(files.plan), "--profile", str(files.profile), "--cluster", str(bad),
                     "--out-dir", str(files.folder / "sim-cj")],
    }[command]
    check_file(capsys, bad, text, argv)


@pytest.mark.parametrize("field", ["speed", "latency_s", "shared_speed"])
def test_extreme_cluster_numbers_still_finish(files: Files, capsys: pytest.CaptureFixture[str], field: str) -> None:
    """Found by test_mutated_cluster_json: a device speed of 1e-300 drove the simulator's clock so far
    that ``now + an action's seconds`` rounded to ``now``, and it never finished."""
    data = json.loads(files.cluster_json.read_text())
    if field == "speed":
        data["devices"][0]["speed"] = 1e-300
    elif field == "latency_s":
        data["intra_node"]["latency_s"] = 1e300
    else:
        data["shared_speed"] = [1e-300] * 2
    bad = files.folder / f"extreme-{field}.json"
    argv = ["simulate", "--plan", str(files.plan), "--profile", str(files.profile), "--cluster", str(bad),
            "--out-dir", str(files.folder / "sim-x")]
    check_file(capsys, bad, json.dumps(data), argv)


@SETTINGS
@given(data=st.data(), command=st.sampled_from(["plan", "simulate"]))
def test_mutated_cluster_yaml(
    files: Files, capsys: pytest.CaptureFixture[str], data: st.DataObject, command: str
) -> None:
    if data.draw(st.integers(0, 5)) == 0:
        text = CLUSTER_YAML[: data.draw(st.integers(0, len(CLUSTER_YAML) - 1))]
    else:
        text = yaml.safe_dump(data.draw(mutated(yaml.safe_load(CLUSTER_YAML))))
    bad = files.folder / "bad-cluster.yaml"
    argv = {
        "plan": ["plan", "--model", "gpt-tiny", "--batch", "8", "--cluster", str(bad),
                 "--out", str(files.folder / "p-cy.json")],
        "simulate": ["simulate", "--plan", str(files.plan), "--cluster", str(bad),
                     "--out-dir", str(files.folder / "sim-cy")],
    }[command]
    check_file(capsys, bad, text, argv)


@SETTINGS
@given(data=st.data(), which=st.sampled_from(["predicted", "measured"]))
def test_mutated_timeline(files: Files, capsys: pytest.CaptureFixture[str], data: st.DataObject, which: str) -> None:
    source = files.predicted if which == "predicted" else files.measured
    text = data.draw(mutated_json(source.read_text()))
    bad = files.folder / f"bad-{which}.json"
    timelines = {"predicted": files.predicted, "measured": files.measured, which: bad}
    argv = ["compare", "--plan", str(files.plan), "--predicted", str(timelines["predicted"]),
            "--measured", str(timelines["measured"]), "--out", str(files.folder / "cmp-t.png")]
    check_file(capsys, bad, text, argv)


# ---- help and --out --------------------------------------------------------------------------


def test_every_option_has_help_with_its_default() -> None:
    from pipetrain.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands
    missing = []
    for name, command in {"": parser, **commands}.items():
        for action in command._actions:
            if not action.option_strings or action.dest in ("help", "version") or action.help == argparse.SUPPRESS:
                continue  # hidden: e.g. --out on a command that writes a folder, which only points to --out-dir
            text = action.help or ""
            flag = f"{name} {action.option_strings[-1]}".strip()
            if not text:
                missing.append(f"{flag}: no help")
            elif name and not action.required and action.const is None and "default" not in text:
                missing.append(f"{flag}: no default in {text!r}")
    assert not missing, missing


def test_compare_out_without_suffix_writes_png(files: Files, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compare", "--plan", str(files.plan), "--predicted", str(files.predicted),
            "--measured", str(files.measured)]
    picture = files.folder / "cmp-no-suffix"
    code, text = outcome(capsys, [*base, "--out", str(picture)])
    assert code == 0, text
    assert not picture.exists()
    assert picture.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{picture}.png" in text
    code, text = outcome(capsys, [*base, "--out", str(files.folder / "cmp.jpg")])
    assert code == 2 and text.strip().startswith("error:") and "ending in .png" in text
    assert not (files.folder / "cmp.jpg").exists()
