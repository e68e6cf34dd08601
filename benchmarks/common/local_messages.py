"""What a gloo message costs its ranks' CPUs, from message-cpu's rows; local-sim prices its messages with it.

message-cpu's rows of kind ``"message"`` hold, per size and round, the wall and each side's CPU
seconds per message; :func:`per_size` takes the median over rounds, :func:`fit` a least-squares line
``a + b · bytes`` per side, and :func:`message_host` reads a stored message-cpu record into the
runtime's per-message host seconds (:class:`~pipetrain.cost.MessageHost`).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from harness import RESULTS
from harness.record import load_record, records_in

from pipetrain.cost import MessageHost

__all__ = ["fit", "message_host", "newest_message_record", "per_size"]


def per_size(rows: list[dict[str, object]]) -> list[dict[str, float]]:
    """Per message size (ascending): the median over rounds of wall, sender and receiver CPU seconds."""
    messages = [r for r in rows if r["kind"] == "message"]
    out = []
    for n in sorted({int(str(r["bytes"])) for r in messages}):
        mine = [r for r in messages if r["bytes"] == n]
        out.append({"bytes": n, **{k: statistics.median(float(str(r[k])) for r in mine)
                                   for k in ("wall_s", "send_cpu_s", "recv_cpu_s")}})
    return out


def fit(sizes: list[dict[str, float]], key: str) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b · bytes``, least squares over :func:`per_size`'s rows."""
    slope, intercept = np.polyfit(np.array([r["bytes"] for r in sizes]), np.array([r[key] for r in sizes]), 1)
    return float(intercept), float(slope)


def newest_message_record() -> Path:
    """The newest complete full (not quick) message-cpu record under ``benchmarks/results/message-cpu``."""
    full = [(record.started, path) for path, record in records_in(RESULTS / "message-cpu")
            if record.complete and not record.run.quick]
    if not full:
        raise SystemExit(f"no full message-cpu record in {RESULTS / 'message-cpu'}: run "
                         "benchmarks/bench_message_cpu.py first, or give --message-cpu RECORD.json")
    return max(full)[1]


def message_host(path: Path, per_byte_extra_s: float = 0.0) -> tuple[MessageHost, MessageHost]:
    """From the message-cpu record ``path``: the smallest message's host seconds on each side (as the
    runtime pays per message on GPUs, where NCCL moves the bytes), and the same plus the fitted seconds
    per byte and ``per_byte_extra_s`` (messages staged through host memory)."""
    sizes = per_size(load_record(path).rows)
    small = sizes[0]
    runtime = MessageHost(send_s=small["send_cpu_s"], recv_s=small["recv_cpu_s"])
    staged = MessageHost(send_s=small["send_cpu_s"], recv_s=small["recv_cpu_s"],
                         send_per_byte_s=fit(sizes, "send_cpu_s")[1] + per_byte_extra_s,
                         recv_per_byte_s=fit(sizes, "recv_cpu_s")[1] + per_byte_extra_s)
    return runtime, staged
