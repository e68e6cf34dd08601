"""Plans `pipetrain plan --method` makes train: the methods whose rules depend on the micro-batch count.

2bw (planned as its flush twin 1f1b, then given as many micro-batches as stages) and dualpipev (a
micro-batch per stage, two chunks per rank) are planned by the command line on estimated V100s, then
trained for a few steps in one launch on gloo; the loss falls on the digits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob, train_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

METHODS = (Method.TWO_BW, Method.DUALPIPEV)
CONFIG = TrainConfig(steps=12, warmup_steps=1, lr=0.01, data="digits", progress=False, timeout_s=60)


def test_planned_methods_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, plans = build_model("mlp-digits"), []
    for method in METHODS:
        out = tmp_path / f"{method.value}.json"
        code = main(["plan", "--model", "mlp-digits", "--batch", "32", "--ranks", "2", "--estimate", "v100",
                     "--method", method.value, "--out", str(out)])
        assert code == 0, capsys.readouterr().err
        plans.append(Plan.from_json(out.read_text()))
    results = train_many([TrainJob(graph, plan, CONFIG) for plan in plans])
    for plan, result in zip(plans, results, strict=True):
        assert plan.method in METHODS and len(result.losses) == CONFIG.steps
        assert sum(result.losses[-3:]) < sum(result.losses[:3]), f"{plan.method.value}: {result.losses}"
