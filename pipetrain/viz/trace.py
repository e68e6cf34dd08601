"""Chrome trace-event JSON of timelines, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout: one process per timeline (``pid`` 1 for the first, 2 for the second, ...), and per rank two
threads: ``tid = 2 * rank`` for compute (F, B, W, STEP) and ``tid = 2 * rank + 1`` for
communication (SEND_*, RECV_*). Every action is one complete event (``"ph": "X"``) named by
its text form (``1F3[48:64]``), with its kind as category, and ``ts``/``dur`` in microseconds. A
SEND and its matching RECV are joined by a flow arrow. Format reference: the "Trace Event Format"
document of the Chromium project.

    write_chrome_trace([predicted, measured], "out/trace.json")   # then open it in Perfetto
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipetrain.fileio import write_atomic
from pipetrain.schedule.action import COMM_KINDS, Action, ActionKind
from pipetrain.simulate.timeline import Event, Timeline

__all__ = ["chrome_trace", "rank_name", "write_chrome_trace"]

TraceEvent = dict[str, Any]
_US_PER_S = 1e6
# A message is identified by its payload (activations or gradients), endpoints and sample range.
_MessageKey = tuple[str, int, int, int, int, int]


def rank_name(timeline: Timeline, rank: int, stage_of_rank: Sequence[int] | None = None) -> str:
    """``"rank 1 · stage 1"`` (``"stages 0,2"`` for a rank that runs several, method interleaved): the
    stages of the rank's actions, and the one ``stage_of_rank`` names."""
    found = {e.action.stage for e in timeline.events if e.rank == rank}
    if stage_of_rank is not None and rank < len(stage_of_rank):
        found.add(stage_of_rank[rank])
    stages = sorted(found)
    if not stages:
        return f"rank {rank}"
    label = "stage" if len(stages) == 1 else "stages"
    return f"rank {rank} · {label} {','.join(map(str, stages))}"


def chrome_trace(
    timeline: Timeline, *, stage_of_rank: Sequence[int] | None = None, pid: int = 1
) -> dict[str, Any]:
    """One timeline as a Chrome trace object (``{"traceEvents": [...], ...}``).

    Args:
        timeline: predicted or measured events; times in seconds.
        stage_of_rank: ``stage_of_rank[r]`` is rank ``r``'s stage, used in thread names; by
            default read from the rank's actions.
        pid: process id for this timeline (distinct per timeline when several are merged).

    Returns:
        A JSON-serialisable dict: ``traceEvents`` (metadata, one ``X`` event per action, flow
        events between matching SEND/RECV pairs), ``displayTimeUnit`` and ``otherData`` (the
        timeline's kind, label, iteration seconds and mean bubble fraction).
    """
    events = _metadata(timeline, pid, stage_of_rank)
    events += [_complete_event(e, pid) for e in sorted(timeline.events, key=_order)]
    events += _flows(timeline, pid)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "kind": timeline.kind,
            "label": timeline.label,
            "iteration_s": timeline.iteration_s,
            "bubble_fraction": timeline.bubble_fraction(),
        },
    }


def write_chrome_trace(
    timelines: Sequence[Timeline],
    path: str | Path,
    *,
    stage_of_rank: Sequence[int] | None = None,
) -> None:
    """Write the timelines as one trace file (atomically), one process each, in the given order."""
    traces = [
        chrome_trace(t, stage_of_rank=stage_of_rank, pid=i + 1) for i, t in enumerate(timelines)
    ]
    merged = {
        "traceEvents": [ev for trace in traces for ev in trace["traceEvents"]],
        "displayTimeUnit": "ms",
        "otherData": {"timelines": [trace["otherData"] for trace in traces]},
    }
    write_atomic(path, json.dumps(merged, separators=(",", ":")))


def _order(event: Event) -> tuple[int, float, float]:
    return event.rank, event.start_s, event.end_s


def _tid(event: Event) -> int:
    return 2 * event.rank + (1 if event.action.kind in COMM_KINDS else 0)


def _metadata(
    timeline: Timeline, pid: int, stage_of_rank: Sequence[int] | None
) -> list[TraceEvent]:
    title = timeline.kind + (f": {timeline.label}" if timeline.label else "")
    meta: list[TraceEvent] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": title}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
         "args": {"sort_index": pid}},
    ]
    for rank in range(timeline.n_ranks):
        name = rank_name(timeline, rank, stage_of_rank)
        for tid, lane in ((2 * rank, "compute"), (2 * rank + 1, "comm")):
            meta.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                 "args": {"name": f"{name} {lane}"}}
            )
            meta.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                 "args": {"sort_index": tid}}
            )
    return meta


def _complete_event(event: Event, pid: int) -> TraceEvent:
    action = event.action
    args: dict[str, Any] = {"stage": action.stage}
    if action.kind is not ActionKind.STEP:
        args.update(microbatch=action.microbatch, lo=action.lo, hi=action.hi, samples=action.size)
    if action.peer is not None:
        args["peer"] = action.peer
    if action.version is not None:
        args["version"] = action.version
    return {
        "ph": "X",
        "pid": pid,
        "tid": _tid(event),
        "name": str(action),
        "cat": action.kind.value,
        "ts": event.start_s * _US_PER_S,
        "dur": max(0.0, event.duration_s) * _US_PER_S,
        "args": args,
    }


def _message_key(event: Event) -> _MessageKey:
    """The same key for a SEND on the sender and the matching RECV on the receiver."""
    action = event.action
    assert action.peer is not None  # communication actions always have a peer
    src, dst = (event.rank, action.peer) if action.is_send else (action.peer, event.rank)
    payload = "F" if action.kind in (ActionKind.SEND_F, ActionKind.RECV_F) else "B"
    return payload, src, dst, action.microbatch, action.lo, action.hi


def _flows(timeline: Timeline, pid: int) -> list[TraceEvent]:
    """Flow arrows from each SEND to its RECV (bound to the slices at their midpoints)."""
    sends: dict[_MessageKey, Event] = {}
    recvs: dict[_MessageKey, Event] = {}
    for event in timeline.events:
        if event.action.kind in COMM_KINDS:
            (sends if event.action.is_send else recvs)[_message_key(event)] = event
    flows: list[TraceEvent] = []
    for flow_id, key in enumerate(sorted(k for k in sends if k in recvs)):
        for phase, event in (("s", sends[key]), ("f", recvs[key])):
            flow: TraceEvent = {
                "ph": phase, "id": pid * 1_000_000 + flow_id, "pid": pid, "tid": _tid(event),
                "name": _flow_name(event.action), "cat": "message",
                "ts": 0.5 * (event.start_s + event.end_s) * _US_PER_S,
            }
            if phase == "f":
                flow["bp"] = "e"  # bind to the enclosing RECV slice, not the next one
            flows.append(flow)
    return flows


def _flow_name(action: Action) -> str:
    payload = "activations" if action.kind in (ActionKind.SEND_F, ActionKind.RECV_F) else "grads"
    return f"{payload} {action.microbatch}[{action.lo}:{action.hi}]"
