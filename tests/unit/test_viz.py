"""viz/: Chrome trace structure, Gantt PNG output and text tables, on hand-built timelines."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from pipetrain.schedule.action import Action
from pipetrain.simulate.timeline import Event, Timeline
from pipetrain.viz.gantt import gantt_figure, save_gantt
from pipetrain.viz.tables import compare_table, relative_error, time_unit, timeline_table
from pipetrain.viz.trace import chrome_trace, rank_name, write_chrome_trace

MS = 1e-3
MIB = 2**20
Row = tuple[int, str, float, float]  # rank, action text, start ms, end ms


def timeline(rows: Sequence[Row], n_ranks: int = 2, **kwargs: Any) -> Timeline:
    events = tuple(Event(r, Action.parse(text), s * MS, e * MS) for r, text, s, e in rows)
    return Timeline(events=events, n_ranks=n_ranks, **kwargs)


# One micro-batch through two stages: F, the message, F; then B back; 6 ms in all.
HANDOFF: list[Row] = [
    (0, "0F0[0:4]", 0.0, 1.0),
    (0, "0SEND_F0[0:4]>1", 1.0, 1.5),
    (1, "1RECV_F0[0:4]<0", 0.0, 1.5),
    (1, "1F0[0:4]", 1.5, 3.0),
    (1, "1B0[0:4]", 3.0, 4.0),
    (1, "1SEND_B0[0:4]>0", 4.0, 4.5),
    (0, "0RECV_B0[0:4]<1", 1.0, 4.5),
    (0, "0B0[0:4]", 4.5, 5.5),
    (0, "0STEP", 5.5, 6.0),
    (1, "1STEP", 4.0, 4.2),
]


def gpipe_rows(n_micro: int = 4, f_ms: float = 1.0, comm_ms: float = 0.2) -> list[Row]:
    """A 2-rank fill-drain timeline of 4-sample micro-batches; B takes twice as long as F.

    With the defaults the iteration takes 15.4 ms: 4 + 1.2 ms of fill, 8 ms of B on rank 1,
    then 0.2 + 2 ms for rank 0's last B.
    """
    rows: list[Row] = []
    for m in range(n_micro):
        rng = f"{m}[{4 * m}:{4 * m + 4}]"
        end0 = (m + 1) * f_ms
        rows += [(0, f"0F{rng}", end0 - f_ms, end0), (0, f"0SEND_F{rng}>1", end0, end0 + comm_ms)]
        rows += [(1, f"1F{rng}", end0 + comm_ms, end0 + comm_ms + f_ms)]
    drain = (n_micro + 1) * f_ms + comm_ms
    for i, m in enumerate(reversed(range(n_micro))):
        rng = f"{m}[{4 * m}:{4 * m + 4}]"
        end1 = drain + 2 * f_ms * (i + 1)
        rows += [(1, f"1B{rng}", end1 - 2 * f_ms, end1)]
        rows += [(0, f"0B{rng}", end1 + comm_ms, end1 + comm_ms + 2 * f_ms)]
    return rows


# ---- trace ----------------------------------------------------------------------------------


def test_chrome_trace_events_are_microseconds_on_compute_and_comm_threads() -> None:
    trace = chrome_trace(timeline(HANDOFF, label="toy"), stage_of_rank=[0, 1])
    json.loads(json.dumps(trace))  # serialisable
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(HANDOFF)
    by_name = {e["name"]: e for e in slices}
    send = by_name["0SEND_F0[0:4]>1"]
    assert send["ts"] == pytest.approx(1000.0) and send["dur"] == pytest.approx(500.0)
    assert (send["pid"], send["tid"], send["cat"]) == (1, 1, "SEND_F")
    assert send["args"] == {"stage": 0, "microbatch": 0, "lo": 0, "hi": 4, "samples": 4, "peer": 1}
    forward = by_name["1F0[0:4]"]
    assert (forward["tid"], forward["cat"], forward["dur"]) == (2, "F", pytest.approx(1500.0))
    assert by_name["1RECV_F0[0:4]<0"]["tid"] == 3
    assert by_name["0STEP"]["args"] == {"stage": 0}
    assert {e["tid"] for e in slices} == {0, 1, 2, 3}
    assert trace["otherData"]["iteration_s"] == pytest.approx(6 * MS)


def test_chrome_trace_names_threads_and_links_sends_to_receives() -> None:
    trace = chrome_trace(timeline(HANDOFF), stage_of_rank=[0, 1], pid=7)
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    assert names == {
        (7, 0): "rank 0 · stage 0 compute", (7, 1): "rank 0 · stage 0 comm",
        (7, 2): "rank 1 · stage 1 compute", (7, 3): "rank 1 · stage 1 comm",
    }
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert sorted((e["ph"], e["tid"]) for e in flows) == [("f", 1), ("f", 3), ("s", 1), ("s", 3)]
    assert len({e["id"] for e in flows}) == 2  # one id per message


def test_write_chrome_trace_one_process_per_timeline(tmp_path: Path) -> None:
    predicted = timeline(HANDOFF, kind="predicted")
    measured = timeline([(r, a, 1.1 * s, 1.1 * e) for r, a, s, e in HANDOFF], kind="measured")
    path = tmp_path / "trace.json"
    write_chrome_trace([predicted, measured], path)
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temporary left behind
    data = json.loads(path.read_text())
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 2 * len(HANDOFF)
    assert {e["pid"] for e in slices} == {1, 2}
    processes = {
        e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"
    }
    assert processes == {1: "predicted", 2: "measured"}
    assert [t["kind"] for t in data["otherData"]["timelines"]] == ["predicted", "measured"]
    late = next(e for e in slices if e["pid"] == 2 and e["name"] == "0B0[0:4]")
    assert late["ts"] == pytest.approx(4950.0) and late["dur"] == pytest.approx(1100.0)


def test_rank_name_reads_stages_from_actions_without_a_mapping() -> None:
    tl = timeline([(0, "0F0[0:2]", 0, 1), (0, "2F0[0:2]", 1, 2)], n_ranks=2)
    assert rank_name(tl, 0) == "rank 0 · stages 0,2"
    assert rank_name(tl, 1) == "rank 1"
    assert rank_name(tl, 1, [0, 1]) == "rank 1 · stage 1"


# ---- gantt ----------------------------------------------------------------------------------


def test_save_gantt_writes_png_of_the_figure_size(tmp_path: Path) -> None:
    predicted = timeline(gpipe_rows(), kind="predicted")
    measured = timeline(gpipe_rows(f_ms=1.2), kind="measured")
    path = tmp_path / "gantt.png"
    save_gantt([predicted, measured], path, titles=["predicted", "measured"], dpi=80)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5_000
    height_in = 0.6 + 2 * (0.85 + 0.5 * 2)
    assert imread(str(path)).shape[:2] == (round(height_in * 80), 12 * 80)


def test_gantt_panels_share_x_and_show_iteration_and_labels() -> None:
    predicted = timeline(gpipe_rows(), kind="predicted")
    measured = timeline(gpipe_rows(f_ms=1.2), kind="measured")
    fig = gantt_figure([predicted, measured])
    top, bottom = fig.axes
    assert top.get_xlim() == bottom.get_xlim()
    assert bottom.get_xlim()[1] == pytest.approx(max(e.end_s for e in measured.events) / MS)
    assert bottom.get_xlabel() == "time (ms)"
    assert top.get_title(loc="left") == "predicted"
    assert top.get_title(loc="right").startswith("iteration 15.4 ms · bubble")
    labels = [t.get_text() for t in top.texts]
    assert sorted(labels) == sorted(["0", "1", "2", "3"] * 4)  # every F and B bar, both ranks
    assert [t.get_text() for t in top.get_yticklabels()] == ["rank 0 · stage 0", "rank 1 · stage 1"]


def test_gantt_omits_labels_from_narrow_bars() -> None:
    rows: list[Row] = [(0, "0F0[0:1]", 0.0, 0.01), (0, "0F1[1:2]", 0.01, 10.0)]
    fig = gantt_figure([timeline(rows, n_ranks=1)])
    assert [t.get_text() for t in fig.axes[0].texts] == ["1"]


def test_gantt_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        gantt_figure([])
    with pytest.raises(ValueError, match="titles"):
        gantt_figure([timeline(HANDOFF)], titles=["a", "b"])


# ---- tables ---------------------------------------------------------------------------------


def test_relative_error_is_signed_fraction_of_measurement() -> None:
    assert relative_error(110.0, 100.0) == pytest.approx(0.1)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.1)
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(1.0, 0.0) == math.inf


def test_time_unit_follows_magnitude() -> None:
    assert time_unit(2.0) == ("s", 1.0)
    assert time_unit(0.05) == ("ms", 1e3)
    assert time_unit(5e-5) == ("µs", 1e6)


def test_timeline_table_lists_busy_bubble_memory_and_iteration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tl = timeline(HANDOFF, peak_activation_bytes=(3 * MIB, MIB // 2), label="toy")
    text = timeline_table(tl, [0, 1])
    assert capsys.readouterr().out == ""  # returned, not printed
    assert "predicted: toy" in text and "busy (ms)" in text
    stage0 = next(line for line in text.splitlines() if "3.0" in line)
    # rank 0 computes 1 + 1 + 0.5 = 2.5 ms of 6 ms: 58.3 % bubble; 3 MiB of activations
    assert "2.5" in stage0 and "58.3" in stage0
    stage1 = next(line for line in text.splitlines() if "0.5" in line and "2.7" in line)
    assert "55.0" in stage1  # 1.5 + 1 + 0.2 = 2.7 ms busy
    assert "iteration 6 ms" in text


def test_compare_table_reports_signed_errors() -> None:
    predicted = timeline([(0, "0F0[0:4]", 0, 2), (1, "1F0[0:4]", 2, 4)])
    measured = timeline([(0, "0F0[0:4]", 0, 2.5), (1, "1F0[0:4]", 2.5, 4.5)], kind="measured")
    text = compare_table(predicted, measured, [0, 1])
    lines = text.splitlines()
    assert "busy pred (ms)" in text and "error %" in text
    stage0 = next(line for line in lines if "2.5" in line and "-20.0" in line)
    assert stage0.split("│")[1].strip() == "0"
    stage1 = next(line for line in lines if "+0.0" in line)
    assert stage1.split("│")[1].strip() == "1"
    iteration = next(line for line in lines if "iteration" in line)
    assert "4.5" in iteration and "-11.1" in iteration  # (4 - 4.5) / 4.5


def test_compare_table_rejects_different_rank_counts() -> None:
    with pytest.raises(ValueError, match="same plan"):
        compare_table(timeline(HANDOFF), timeline(HANDOFF, n_ranks=3))
