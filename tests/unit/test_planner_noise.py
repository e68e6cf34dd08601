"""Plans within the profile's noise of the fastest (issue 32): the choice among them depends on their
structure only, ``api.plan`` makes it for any planner, and ``pipetrain plan`` says so in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipetrain import api
from pipetrain.cli import main
from pipetrain.graph.zoo import build_model
from pipetrain.planners.contract import Candidate, Constraints, PlanningResult
from pipetrain.planners.noise import robust_key, within_noise
from pipetrain.profile.noise import ProfileNoise
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.viz.plan_tables import candidates_table, result_tables, within_noise_line

EPSILON = 0.1


def _profile() -> Profile:
    """A synthetic gpt-tiny profile under which many plans are predicted within 10% of the fastest."""
    graph = build_model("gpt-tiny")
    layers = tuple(LayerProfile(name, (1, 8), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6)
                   for name in graph.names)
    return Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers)


@pytest.fixture(scope="module")
def planned() -> PlanningResult:
    """The balanced planner's answer on 2 ranks, without noise applied: planned with a profile of 10%
    noise, so that the planner scores every candidate within 10% of the fastest (it skips slower ones,
    :func:`~pipetrain.planners.score.best_first`), and its choice (the fastest) kept as it was."""
    noisy = dataclasses.replace(_profile(), noise=ProfileNoise(EPSILON, 0.03, 40, 2, 5))
    result = api.plan(build_model("gpt-tiny"), noisy, api.local_cluster(2), batch_size=8)
    return dataclasses.replace(result, plan=result.candidates[0].plan, within_noise=(), noise=None)


def _close(result: PlanningResult) -> list[Candidate]:
    fastest = result.candidates[0].iteration_s
    return [c for c in result.candidates if c.feasible and c.iteration_s <= fastest * (1 + EPSILON / 2)]


def test_without_noise_the_planner_s_choice_stands(planned: PlanningResult) -> None:
    assert planned.noise is None and planned.within_noise == ()
    assert within_noise(planned, None) is planned and within_noise(planned, 0.0) is planned
    assert within_noise_line(planned) is None


def test_within_noise_keeps_the_most_robust_and_lists_them_fastest_first(planned: PlanningResult) -> None:
    result = within_noise(planned, EPSILON)
    assert len(result.within_noise) >= 2 and result.noise == EPSILON
    times = [c.iteration_s for c in result.within_noise]
    assert times == sorted(times) and times[-1] <= times[0] * (1 + EPSILON)
    assert result.plan == min(result.within_noise, key=robust_key).plan
    assert [c.plan for c in result.candidates] == [c.plan for c in planned.candidates]  # untouched


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_jitter_within_the_noise_does_not_change_the_choice(planned: PlanningResult, data: st.DataObject) -> None:
    close = _close(planned)
    base = min(c.iteration_s for c in close)
    jittered = tuple(dataclasses.replace(c, iteration_s=base * data.draw(st.floats(1.0, 1 + EPSILON / 2)))
                     for c in close)
    fastest = min(jittered, key=lambda c: c.iteration_s)
    shuffled = data.draw(st.permutations(jittered))
    result = within_noise(dataclasses.replace(planned, plan=fastest.plan, candidates=tuple(shuffled)), EPSILON)
    assert result.plan == min(close, key=robust_key).plan
    assert len(result.within_noise) == len(close)


def test_a_plan_kept_for_other_reasons_is_not_replaced(planned: PlanningResult) -> None:
    slowest = api.plan(build_model("gpt-tiny"), _profile(), api.local_cluster(2), batch_size=8,
                       constraints=Constraints(n_micro=1))  # half the time a bubble: far outside the noise
    kept = dataclasses.replace(planned, plan=slowest.plan)
    result = within_noise(kept, EPSILON)
    assert result.plan == slowest.plan and result.within_noise == ()


def test_the_robust_order_prefers_fewer_ranks_then_a_simpler_method(planned: PlanningResult) -> None:
    by_method = {c.plan.method.value: c for c in planned.candidates}
    assert robust_key(by_method["1f1b"])[:2] < robust_key(by_method["zb1"])[:2]  # split backward: more complex
    one_rank = api.plan(build_model("gpt-tiny"), _profile(), api.local_cluster(1), batch_size=8).candidates[0]
    assert robust_key(one_rank) < robust_key(by_method["gpipe"])


def test_api_plan_applies_the_profile_s_noise(planned: PlanningResult) -> None:
    noisy = dataclasses.replace(_profile(), noise=ProfileNoise(EPSILON, 0.03, 40, 2, 5))
    result = api.plan(build_model("gpt-tiny"), noisy, api.local_cluster(2), batch_size=8)
    assert result.noise == EPSILON and result.plan == within_noise(planned, EPSILON).plan
    assert result.within_noise


def test_the_line_names_the_plans_within_the_noise(planned: PlanningResult) -> None:
    result = within_noise(planned, EPSILON)
    line = within_noise_line(result, listed=2)
    assert line is not None and "\n" not in line
    n = len(result.within_noise)
    assert line.startswith(f"{n} plans are within the measurement noise (±10%) of the fastest: ")
    assert f"… ({n - 2} more)" in line and " ms, " in line and "the fastest may differ on another run" in line
    assert f"kept {result.plan.method.value} [" in line


def test_the_candidates_table_marks_the_plan_kept(planned: PlanningResult) -> None:
    """The table stays fastest first; when the noise rule keeps another plan, its row says ``kept``."""
    result = within_noise(planned, EPSILON)
    rows = [c.plan for c in result.candidates]
    assert result.plan != rows[0]  # the robust choice is not the fastest here
    table = " ".join(result_tables(result, top=len(rows))[-1].split())
    assert f"{rows.index(result.plan) + 1} kept " in table and "as fast as #1 within the profile's noise" in table
    assert "kept" not in candidates_table(list(planned.candidates), kept=planned.plan)  # the fastest kept: no mark


def test_plan_prints_the_within_noise_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.json"
    dataclasses.replace(_profile(), noise=ProfileNoise(EPSILON, 0.03, 40, 2, 5)).save(profile)
    code = main(["plan", "--model", "gpt-tiny", "--batch", "8", "--ranks", "2", "--profile", str(profile),
                 "--planner", "balanced", "--out", str(tmp_path / "plan.json")])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 0, said
    assert "plans are within the measurement noise (±10%) of the fastest" in said
