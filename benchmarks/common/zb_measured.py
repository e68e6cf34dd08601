"""Measured runs of the schedule benchmarks (zb, interleaved, interleaved-zb, umpipe-measured).

A :class:`Case` is one plan to train on this machine's two local ranks (gloo, one thread each) with
its prediction; :func:`train_cases` trains several once each, one after another in one launch (the
ranks start once), bounded, and returns a row per case. A benchmark reverses the order every other
round, so that each case runs early and late. Rows: ``model``, ``label``, ``status`` (``"ok"``,
``"timeout: …"`` or ``"error: …"``),
``samples_per_s``, ``iteration_s`` (median timed step), ``predicted_s`` (the event simulator's
iteration time), ``step_times_s`` (every step, warm-up included).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness import Row, bounded

from common.measured import WARMUP_STEPS, probe_cluster
from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.graph.zoo import build_model
from pipetrain.plan.plan import Plan
from pipetrain.runtime import TrainConfig, TrainJob, train_many

__all__ = ["MEASURED", "QUICK_BLOCKS", "Case", "Setting", "add_grid_arguments", "median_rate", "paired_ratio",
           "prediction_error", "this_machine", "train_cases"]


@dataclass(frozen=True)
class Case:
    """One measured configuration: ``plan`` of zoo model ``model``, its label and predicted iteration seconds."""

    model: str
    label: str
    plan: Plan
    predicted_s: float


MEASURED = {"mlp": 128, "gpt-tiny": 64}  # the measured models of the interleaved benchmarks, and their batches
QUICK_BLOCKS = 14  # --quick: gpt1-14 with 16 layers, whole blocks for 4 ranks × 4 chunks
Setting = tuple[str, int] | tuple[Case, ...]  # ("simulated", ranks) or one model's measured cases


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The options the interleaved benchmarks share: the simulated model and batch, the measured steps."""
    p.add_argument("--blocks", type=int, default=30,
                   help="gpt1-14's transformer blocks when simulated (default 30; 14 with --quick)")
    p.add_argument("--batch", type=int, default=64, help="batch when simulated (default 64)")
    p.add_argument("--steps", type=int, default=8, help="steps per measured run, 2 untimed (default 8)")


def this_machine(quick: bool, overhead_s: float | None, n_probes: int) -> Cluster:
    """The two local ranks as a cluster: probed (link and contention, and the per-action cost when
    ``overhead_s`` is None); with ``quick`` the defaults, unprobed (a probe spawns ranks: seconds)."""
    return api.local_cluster(2) if quick else probe_cluster(overhead_s, n_probes)[0]


def train_cases(cases: Sequence[Case], steps: int, timeout_s: float) -> list[Row]:
    """Train each case for ``steps`` steps (:data:`~common.measured.WARMUP_STEPS` untimed) in one
    launch, killed past ``timeout_s`` per case; a launch that fails gives every case its status."""
    config = TrainConfig(steps=steps, warmup_steps=WARMUP_STEPS, progress=False, threads_per_rank=1,
                         timeout_s=min(60.0, timeout_s))
    jobs = [TrainJob(build_model(c.model), c.plan, config) for c in cases]
    results, status = bounded(functools.partial(train_many, jobs), timeout_s * len(cases))
    rows = []
    for k, case in enumerate(cases):
        row: Row = {"model": case.model, "label": case.label, "status": status, "samples_per_s": None,
                    "iteration_s": None, "predicted_s": case.predicted_s, "step_times_s": []}
        if results is not None:
            out, timed = results[k], results[k].step_times_s[WARMUP_STEPS:]
            row.update(samples_per_s=out.samples_per_s, step_times_s=list(out.step_times_s),
                       iteration_s=statistics.median(timed) if timed else None)
        rows.append(row)
    return rows


def median_rate(rows: Sequence[Row]) -> float | None:
    """The median samples/s of the rows that ran."""
    rates = [r["samples_per_s"] for r in rows if r["samples_per_s"]]
    return statistics.median(rates) if rates else None


def paired_ratio(rows: Sequence[Row], label: str, base: str) -> float | None:
    """The median over rounds of ``label``'s samples/s over ``base``'s in the same round (less
    sensitive to the machine's load drifting between rounds than a ratio of medians)."""
    rate = {(r["label"], r["round"]): r["samples_per_s"] for r in rows if r["samples_per_s"]}
    ratios = [rate[(label, k)] / rate[(base, k)] for (name, k) in rate if name == label and (base, k) in rate]
    return statistics.median(ratios) if ratios else None


def prediction_error(rows: Sequence[Row], batch: int) -> float | None:
    """(predicted − measured) / measured samples/s, in %, of the median run; None when none ran."""
    rate = median_rate(rows)
    predicted = rows[0]["predicted_s"] if rows else None
    return None if rate is None or not predicted else 100 * (batch / predicted - rate) / rate
