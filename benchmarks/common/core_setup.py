"""What the Core benchmark decides before its timed rounds: the grid of configurations, and per
model its profile, its cluster (probed on its own work, then calibrated on it) and every plan's
prediction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from common.core_plans import SCHEDULES, describe, setting_plans
from common.measured import profile_logged
from common.torch_baseline import stage_layers
from common.torch_schedules import SCHEDULES as TORCH_SCHEDULES
from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.profile.table import Profile
from pipetrain.simulate.timeline import Timeline

__all__ = ["KINDS", "Config", "Kind", "ModelSetup", "configs", "setup_model"]

Kind = Literal["single", "single+alloc", "torch", "torch+alloc", "pipetrain", "planned", "planned-noalloc"]
KINDS: tuple[Kind, ...] = ("single", "single+alloc", "torch", "torch+alloc", "pipetrain", "planned", "planned-noalloc")


@dataclass(frozen=True)
class Config:
    """One configuration of one model: ``single`` (one process, ``+alloc`` with pipetrain's allocator
    setting), a ``torch`` schedule at ``n_micro`` (``torch+alloc``: with the allocator setting too), a
    ``pipetrain`` schedule at ``n_micro``, or pipetrain's ``planned`` setting."""

    kind: Kind
    schedule: str = ""
    n_micro: int = 0

    @property
    def label(self) -> str:
        scheduled = self.kind in ("torch", "torch+alloc", "pipetrain")
        return f"{self.kind} {self.schedule} m={self.n_micro}" if scheduled else self.kind


@dataclass
class ModelSetup:
    """One model's profile, cluster, plans and predictions; ``failed``: labels that timed out (not
    retried); ``planned_runs``: the planned setting's measured samples/s and timeline, per run."""

    name: str
    graph: LayerGraph
    batch: int
    steps: int
    profile: Profile
    cluster: Cluster
    plans: dict[str, Plan]
    predicted: dict[str, Timeline]
    predicted_alone_s: dict[str, float]
    info: dict[str, Any]  # what the report states about the setup (a row of its own)
    failed: set[str] = field(default_factory=set)
    planned_runs: list[tuple[float, Timeline]] = field(default_factory=list)
    reported: bool = False


def configs(micro: Sequence[int], kinds: Sequence[str] = KINDS) -> list[Config]:
    """Single process, torch × schedule × m (those torch allows; without and with the allocator setting),
    pipetrain × schedule × m, planned; only the ``kinds`` asked for."""
    out = [Config("single"), Config("single+alloc")]
    out += [Config(kind, s, m) for kind in ("torch", "torch+alloc") for s in TORCH_SCHEDULES for m in micro
            if TORCH_SCHEDULES[s].allows(m, 2)]
    out += [Config("pipetrain", s, m) for s in SCHEDULES for m in micro]
    out += [Config("planned"), Config("planned-noalloc")]
    return [c for c in out if c.kind in kinds]


def setup_model(name: str, batch: int, steps: int, cluster: Cluster, micro: Sequence[int],
                calibrate: bool, quick: bool = False) -> ModelSetup:
    """Profile the model, calibrate the cluster on its own work (unless not ``calibrate``), build every
    pipetrain plan (the grid's and ``auto``'s, every planner tried, the fastest prediction kept) and
    predict each, also on ranks that never slow each other (brackets the contention model). ``quick``:
    profile and calibrate with fewer timings."""
    graph = build_model(name)
    profile = profile_logged(graph, batch, repeats=2 if quick else 5)
    calibration = ""
    if calibrate:
        from pipetrain.calibrate.fit import calibrate_cluster

        fitted = calibrate_cluster(graph, profile, cluster, batch, runs=1 if quick else 3, steps=4 if quick else 10)
        cluster, calibration = fitted.apply(cluster), fitted.describe()
        print(f"[{name}] calibrated: {calibration}", flush=True)
    plans = setting_plans(graph, CostModel(profile, cluster), batch, micro)
    auto = api.plan(graph, profile, cluster, batch_size=batch, planner="auto")
    plans["planned"] = auto.plan
    predicted = {label: api.predict(plan, profile, cluster)[1] for label, plan in plans.items()}
    predicted["single"] = predicted["single+alloc"] = _predict_single(graph, profile, batch, cluster)
    predicted["planned-noalloc"] = predicted["planned"]
    alone = replace(cluster, shared_speed=())
    predicted_alone = {label: api.predict(plan, profile, alone)[1].iteration_s for label, plan in plans.items()}
    note = _partition_note(graph, plans)
    print(f"[{name}] planned: {describe(auto.plan)}, predicted {predicted['planned'].iteration_s * 1e3:.1f} ms; "
          f"{note}", flush=True)
    info = {"model": name, "batch": batch, "steps": steps, "planned": describe(auto.plan),
            "planned_plan": json.loads(auto.plan.to_json()), "partition": note, "profile_source": profile.source,
            "calibration": calibration, "predicted_s": {k: t.iteration_s for k, t in predicted.items()},
            "planned_top_candidates": [(c.plan.method.value, len(c.plan.stages[0].forward_sizes), c.iteration_s)
                                       for c in auto.candidates[:8]]}
    return ModelSetup(name, graph, batch, steps, profile, cluster, plans, predicted, predicted_alone, info)


def _predict_single(graph: LayerGraph, profile: Profile, batch: int, cluster: Cluster) -> Timeline:
    """The simulator's time for one rank of ``cluster`` running the whole model on the whole batch, alone."""
    alone = replace(cluster.with_ranks(1), shared_speed=())
    plan = build_balanced_plan(ModelRef.of(graph), CostModel(profile, alone), method=Method.GPIPE, n_stages=1,
                               batch_size=batch, n_micro=1)
    return api.predict(plan, profile, alone)[1]


def _partition_note(graph: LayerGraph, plans: dict[str, Plan]) -> str:
    """Whether pipetrain's balanced partitions equal torch's equal-layer split."""
    equal = tuple(tuple(graph.names[i] for i in stage_layers(len(graph), k)) for k in range(2))
    differ = sorted(label for label, plan in plans.items() if tuple(s.layers for s in plan.stages) != equal)
    if not differ:
        return "every pipetrain partition equals torch's equal-layer split"
    return f"partitions differing from the equal-layer split: {', '.join(differ)}"
