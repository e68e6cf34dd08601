"""The runtime's cost per action on one model, as calibration prices it and as its actions measure.

    .venv/bin/python benchmarks/common/action_cost.py --model mlp --batch 128     # prints one JSON row

Runs with whichever ``pipetrain`` is first on ``PYTHONPATH``, so that bench_action_cost.py can time
another checkout (``--base``) beside this one, alternately. For ``model`` on 2 local ranks (the
default cluster, one thread per rank): the profile at ``batch``, then calibration's two runs
(:func:`pipetrain.calibrate.fit.calibration_plans`: ``1f1b`` m=1 and ``zbv`` m=min(8, batch), each the
median of ``runs`` runs of ``steps`` timed steps) and the fitted ``(speed, overhead_s)``
(:func:`~pipetrain.calibrate.fit.fit_terms`) as ``pipetrain probe --calibrate`` fits them (it also
probes the link; here the default one prices the messages). From the zbv run with the median
iteration: per compute kind (F, B, W, STEP) the mean measured seconds of one action in its median
step, beside the profile's seconds for the same actions (speed 1, no overhead).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

__all__ = ["COMPUTE_KINDS", "measure"]

COMPUTE_KINDS = ("F", "B", "W", "STEP")


def _per_action(timeline: Any) -> dict[str, tuple[int, float]]:
    """Per compute kind: how many actions the timeline has, and their mean seconds."""
    spans: dict[str, list[float]] = defaultdict(list)
    for event in timeline.events:
        if event.action.kind.value in COMPUTE_KINDS:
            spans[event.action.kind.value].append(event.duration_s)
    return {kind: (len(s), statistics.fmean(s)) for kind, s in spans.items()}


def measure(model: str, batch: int, *, runs: int = 2, steps: int = 10, profile_repeats: int = 3) -> dict[str, Any]:
    """One row: the calibrated terms of ``model`` at ``batch`` and its zbv run's seconds per action (module
    docstring)."""
    from pipetrain import api
    from pipetrain.calibrate.fit import calibration_plans, fit_terms, with_terms
    from pipetrain.graph.zoo import build_model
    from pipetrain.runtime import TrainConfig, train

    graph = build_model(model)
    t0 = time.perf_counter()
    profile = api.profile_model(graph, batch, repeats=profile_repeats)
    profile_s = time.perf_counter() - t0
    cluster = api.local_cluster(2)
    plans = calibration_plans(graph, profile, cluster, batch)
    config = TrainConfig(steps=steps, warmup_steps=2, progress=False, threads_per_rank=1)
    results = [sorted((train(graph, plan, config) for _ in range(max(1, runs))), key=lambda r: -r.samples_per_s)
               for plan in plans]
    measured = [statistics.median(batch / r.samples_per_s for r in rs) for rs in results]
    speed, overhead = fit_terms(plans, profile, cluster, measured)
    zbv = results[1][len(results[1]) // 2]  # the run with the median iteration
    predicted = api.predict(plans[1], profile, with_terms(cluster, 1.0, 0.0))[1]
    return {"model": model, "batch": batch, "speed": speed, "overhead_s": overhead,
            "settings": [f"{p.method.value} m={len(p.stages[0].forward_sizes)}" for p in plans],
            "measured_s": measured, "profile_s": profile_s,
            "measured_per_action": _per_action(zbv.timeline), "profiled_per_action": _per_action(predicted)}


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile-repeats", type=int, default=3)
    a = p.parse_args()
    print(json.dumps(measure(a.model, a.batch, runs=a.runs, steps=a.steps, profile_repeats=a.profile_repeats)))


if __name__ == "__main__":
    _main()
