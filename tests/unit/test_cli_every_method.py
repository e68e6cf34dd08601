"""`pipetrain plan --method M` gives a runnable plan for every method of the table (issue 27).

For each method in :data:`~pipetrain.plan.methods.METHODS` (so a new row is covered without editing
this file; on 3 ranks too where its rules depend on the stage count), `plan` runs as the command
line does on mlp-digits with profiles estimated for a V100 (no timing on this machine). The plan
file then goes through everything `train` checks before it starts a rank: the plan against the
model, its schedule built and validated (the validator's dry run included), the handlers, the data
and the loss (:func:`~pipetrain.runtime.job.checks.check_job`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import METHODS, Method
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob
from pipetrain.runtime.job.checks import check_job

CHECKED = TrainConfig(steps=4, warmup_steps=1, data="digits", progress=False)


def plan_with(capsys: pytest.CaptureFixture[str], out: Path, method: Method, ranks: int,
              batch: int = 64) -> tuple[Plan, str]:
    """`plan --method` on ``ranks`` estimated V100s: the plan file and what was printed."""
    code = main(["plan", "--model", "mlp-digits", "--batch", str(batch), "--ranks", str(ranks), "--estimate", "v100",
                 "--method", method.value, "--out", str(out), "--top", "100"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    return Plan.from_json(out.read_text()), captured.out


def _depends_on_the_stage_count(method: Method) -> bool:
    """Whether the method's rules change with the stage count (a micro-batch per stage, chunks per rank)."""
    spec = METHODS[method]
    return spec.microbatches_per_stage or spec.multi_stage


CASES = [(m, 2) for m in METHODS] + [(m, 3) for m in METHODS if _depends_on_the_stage_count(m)]


@pytest.mark.parametrize(("method", "ranks"), CASES)
def test_plan_for_every_method_is_runnable(method: Method, ranks: int, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    graph = build_model("mlp-digits")
    plan, text = plan_with(capsys, tmp_path / "plan.json", method, ranks, batch=16)
    if plan.method is not method:  # a micro-batch planner that finds nothing faster says so and keeps its base
        assert "kept the best equal plan" in text
    assert plan.weights in METHODS[plan.method].weights
    assert plan.n_ranks <= ranks
    job = check_job(TrainJob(graph, plan, CHECKED))
    assert job.schedule is not None and job.schedule.n_ranks == plan.n_ranks
    if METHODS[method].microbatches_per_stage:
        assert min(len(s.forward_sizes) for s in plan.stages) >= plan.n_stages


def test_a_twin_plans_best_the_method_refuses_gives_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2bw is planned as the best 1f1b plan, which has one micro-batch here; 2BW needs one per stage,
    so `plan` keeps the fastest 1f1b plan it can run, and lists only those."""
    plan, _ = plan_with(capsys, tmp_path / "1f1b.json", Method.ONE_F_ONE_B, 2)
    assert len(plan.stages[0].forward_sizes) == 1  # the premise: 1f1b's best runs one micro-batch
    plan, text = plan_with(capsys, tmp_path / "2bw.json", Method.TWO_BW, 2)
    assert "[64×1]" not in text and "[32×2]" in text
    assert plan.method is Method.TWO_BW and plan.stages[0].forward_sizes == (32, 32)


def test_a_count_the_method_refuses_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "mlp-digits", "--batch", "64", "--ranks", "2", "--estimate", "v100",
                 "--method", "2bw", "--micro", "1", "--out", str(tmp_path / "p.json")])
    captured = capsys.readouterr()
    assert code == 2 and "needs at least as many micro-batches as stages (2), got 1" in captured.err + captured.out
    assert not (tmp_path / "p.json").exists()
