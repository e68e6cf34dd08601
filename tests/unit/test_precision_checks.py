"""What :func:`~pipetrain.runtime.job.checks.check_job` does with a precision before any rank starts:
``TrainConfig.precision`` overrides the plan's, fp16 needs stages that step together, and a fake
overflow needs fp16."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.runtime import TrainConfig, TrainJob
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.config import FaultInjection
from tests.gloo.models import chain_plan, mlp_graph

GRAPH = mlp_graph()
PLAN = chain_plan(GRAPH, 2, 8, 2, Method.ONE_F_ONE_B)
CONFIG = TrainConfig(steps=2, progress=False)


@pytest.mark.parametrize(("planned", "given", "runs"), [("fp32", None, "fp32"), ("bf16", None, "bf16"),
                                                        ("bf16", "fp16", "fp16"), ("fp16", "fp32", "fp32")])
def test_config_precision_overrides_the_plan(planned: str, given: str | None, runs: str) -> None:
    job = TrainJob(GRAPH, replace(PLAN, precision=planned), replace(CONFIG, precision=given))  # type: ignore[arg-type]
    assert check_job(job).plan.precision == runs


def test_fp16_needs_stages_that_step_together() -> None:
    plan = replace(PLAN.run_by(Method.TWO_BW, False), precision="fp16")
    with pytest.raises(UserError, match="--precision bf16"):
        check_job(TrainJob(GRAPH, plan, CONFIG))
    assert check_job(TrainJob(GRAPH, replace(plan, precision="bf16"), CONFIG)).plan.precision == "bf16"


def test_fake_overflow_needs_fp16() -> None:
    config = replace(CONFIG, fault=FaultInjection(0, 1, "overflow"))
    with pytest.raises(UserError, match="precision fp16"):
        check_job(TrainJob(GRAPH, PLAN, config))
    assert check_job(TrainJob(GRAPH, PLAN, replace(config, precision="fp16"))).plan.precision == "fp16"


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(UserError, match="bf16"):
        TrainConfig(precision="fp8")  # type: ignore[arg-type]
