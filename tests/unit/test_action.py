"""Action text form: str and parse are exact inverses for every kind (STYLE.md L1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipetrain.schedule.action import COMM_KINDS, Action, ActionKind
from pipetrain.schedule.schedule import Schedule


@st.composite
def actions(draw: st.DrawFn) -> Action:
    kind = draw(st.sampled_from(list(ActionKind)))
    stage = draw(st.integers(0, 99))
    version = draw(st.none() | st.integers(0, 9))
    if kind is ActionKind.STEP:
        return Action(kind, stage, version=version)
    lo = draw(st.integers(0, 500))
    hi = draw(st.integers(lo + 1, lo + 300))
    peer = draw(st.integers(0, 64)) if kind in COMM_KINDS else None
    return Action(kind, stage, draw(st.integers(0, 300)), lo, hi, peer, version)


@given(actions())
def test_text_round_trip(action: Action) -> None:
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2F0[0:16]", Action(ActionKind.F, 2, 0, 0, 16)),
        ("1B3[48:64]", Action(ActionKind.B, 1, 3, 48, 64)),
        ("0SEND_F1[16:32]>1", Action(ActionKind.SEND_F, 0, 1, 16, 32, peer=1)),
        ("1RECV_B1[16:32]<2", Action(ActionKind.RECV_B, 1, 1, 16, 32, peer=2)),
        ("0STEP", Action(ActionKind.STEP, 0)),
        ("2F0[0:16]v3", Action(ActionKind.F, 2, 0, 0, 16, version=3)),
    ],
)
def test_known_texts(text: str, expected: Action) -> None:
    assert Action.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("bad", ["", "F0", "2X0[0:1]", "0F0[3:3]", "0SEND_F0[0:4]<1", "0F0[0:4]>1", "0STEP[0:4]"])
def test_malformed_text_raises(bad: str) -> None:
    with pytest.raises(ValueError):
        Action.parse(bad)


def test_schedule_csv_and_json_round_trip() -> None:
    text = (
        "0F0[0:2],0SEND_F0[0:2]>1,0RECV_B0[0:2]<1,0B0[0:2],0STEP\n"
        "1RECV_F0[0:2]<0,1F0[0:2],1B0[0:2],1SEND_B0[0:2]>0,1STEP\n"
    )
    schedule = Schedule.from_csv(text)
    assert schedule.to_csv() == text
    assert Schedule.from_json(schedule.to_json()) == schedule
    assert schedule.n_ranks == 2


def test_grid_marks_cell() -> None:
    schedule = Schedule.from_csv("0F0[0:2],0STEP\n1F0[0:2],1STEP\n")
    grid = schedule.grid(mark=(1, 1))
    assert ">>1STEP<<" in grid
    assert grid.splitlines()[0].split() == ["rank", "0", "rank", "1"]


@pytest.mark.parametrize(
    ("kind", "channel"),
    [(ActionKind.SEND_F, "F"), (ActionKind.RECV_F, "F"), (ActionKind.SEND_B, "B"), (ActionKind.RECV_B, "B")],
)
def test_channel_of_communication_actions(kind: ActionKind, channel: str) -> None:
    assert Action(kind, 0, 0, 0, 4, peer=1).channel == channel


@pytest.mark.parametrize("kind", [ActionKind.F, ActionKind.B, ActionKind.W])
def test_channel_of_compute_action_raises(kind: ActionKind) -> None:
    with pytest.raises(ValueError, match="not a communication action"):
        _ = Action(kind, 0, 0, 0, 4).channel
    with pytest.raises(ValueError, match="not a communication action"):
        _ = Action(ActionKind.STEP, 0).channel
