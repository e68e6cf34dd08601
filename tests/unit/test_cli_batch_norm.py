"""`pipetrain plan` and `pipetrain train` on a BatchNorm model, and `pipetrain.plan`/`pipetrain.train`
(issue 26 §4): one line says that its statistics are per micro-batch when a plan has several, and
nothing when it has one.

Plans use profiles estimated for a V100 (no timing here); training is never launched:
``launch_local`` is a stub that stops once the job was checked, as in test_cli_local.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

import pipetrain
from pipetrain.cli import main
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from tests.bn_net import build
from tests.bn_net import graph as bn_graph

MODEL = ("--model", "tests.bn_net:build", "--data", "digits", "--batch", "8")
STATISTICS = ("BatchNorm stem.1, blocks.0.1, blocks.1.1 and 1 more normalise each micro-batch on its own (4 per batch "
              "of 8): their statistics, and the training, differ from single-process training on the whole batch")


class _Launched(Exception):
    """Raised by the stub launcher: training would start here."""


@pytest.fixture
def launches() -> Iterator[mock.MagicMock]:
    with mock.patch("pipetrain.runtime.train.launch_local", side_effect=_Launched) as stub:
        yield stub


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "normalise each micro-batch" in r.getMessage()]


def _plan(tmp_path: Path, caplog: pytest.LogCaptureFixture, micro: int) -> Path:
    out = tmp_path / f"plan-{micro}.json"
    with caplog.at_level(logging.WARNING):
        assert main(["plan", *MODEL, "--ranks", "2", "--estimate", "v100", "--method", "1f1b", "--micro", str(micro),
                     "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(("micro", "said"), [(4, [STATISTICS]), (1, [])])
def test_plan_says_once_that_statistics_are_per_micro_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                            micro: int, said: list[str]) -> None:
    _plan(tmp_path, caplog, micro)
    assert _warnings(caplog) == said


@pytest.mark.parametrize(("micro", "said"), [(4, [STATISTICS]), (1, [])])
def test_train_says_it_once_before_starting_the_ranks(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      launches: mock.MagicMock, micro: int, said: list[str]) -> None:
    plan = _plan(tmp_path, caplog, micro)
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(_Launched):
        main(["train", "--plan", str(plan), *MODEL, "--steps", "2", "--out-dir", str(tmp_path / "run")])
    assert launches.call_count == 1
    assert _warnings(caplog) == said


def test_the_python_api_says_it_once(caplog: pytest.LogCaptureFixture, launches: mock.MagicMock) -> None:
    """``pipetrain.plan`` says it for the plan it returns; ``pipetrain.train`` once for the plan it runs."""
    graph = bn_graph()
    four = chain_plan(graph, 4)
    with caplog.at_level(logging.WARNING), mock.patch("pipetrain.quick._plan", return_value=four):
        assert pipetrain.plan(build(), "digits", ranks=2, batch_size=8) == four
    assert _warnings(caplog) == [STATISTICS]
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(_Launched):
        pipetrain.train(build(), "digits", plan=four, steps=2)
    assert _warnings(caplog) == [STATISTICS]
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(_Launched):
        pipetrain.train(build(), "digits", plan=chain_plan(graph, 1), steps=2)
    assert _warnings(caplog) == []


def chain_plan(graph: LayerGraph, n_micro: int) -> Plan:
    """Two 1f1b stages of the BatchNorm net, ``n_micro`` equal micro-batches of a batch of 8."""
    sizes = equal_sizes(8, n_micro)
    half = len(graph) // 2
    stages = (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes))
    return Plan(graph.name, graph.fingerprint(), 8, Method.ONE_F_ONE_B, stages)
