"""Overhead probe: the runtime's fixed seconds per compute action (F, B, W, STEP), measured on this machine.

    overhead = probe_action_overhead(link)           # ~15 s: three short 2-rank runs of a tiny model
    cluster = probe_local_cluster(2)                 # the link, the contention and the overhead

The simulator prices every F, B and W action at ``action_overhead_s`` plus its layers' profiled
seconds (:class:`~pipetrain.cost.CostModel`). That overhead is the runtime's own work around the
kernels — Python dispatch, posting receives and sends, buffer bookkeeping — and it is what prices
many small actions (many micro-batches, interleaved chunks, the split backward's W) against a few
large ones. It used to be a constant calibrated once on one machine
(:data:`~pipetrain.cluster.CPU_ACTION_OVERHEAD_S`); this probe measures it where the job runs.

How: a tiny MLP (``mlp`` of the zoo at width 8, so each action's kernels take microseconds) is
profiled, cut into one stage per rank by the balanced planner, and trained for a few steps with
1F1B on ``micro`` one-sample micro-batches; each step then consists almost only of overhead and
messages. The simulator's iteration time ``T(o)`` of that plan is linear in the overhead ``o``
where actions dominate (``T(o) = T(0) + n·o``, ``n`` the actions on the critical path, found from
two simulations), so the measured median step ``T_m`` gives ``o = (T_m - T(0)) / n``. The link
``link`` and the ranks' host seconds per message ``message_host`` (both from
:func:`~pipetrain.profile.link.probe_link`) price the messages, so they are not counted twice: the
overhead is what is left per compute action.
"""

from __future__ import annotations

import logging
import os
import statistics
from dataclasses import dataclass, replace

from pipetrain.cluster import NO_MESSAGE_HOST, Cluster, Link, MessageHost
from pipetrain.cost import CostModel
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import build_balanced_plan
from pipetrain.planners.contract import ModelRef
from pipetrain.profile.link import Workload, probe_cluster
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.noise import load_average
from pipetrain.profile.table import Profile
from pipetrain.runtime import TrainConfig, TrainJob, train_many
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

__all__ = ["OverheadProbe", "probe_action_overhead", "probe_local_cluster"]

log = logging.getLogger(__name__)

_PROBE_WIDTH = 8
_SLOPE_STEP_S = 1e-3


@dataclass(frozen=True)
class OverheadProbe:
    """What :func:`probe_action_overhead` measured.

    Attributes:
        overhead_s: the fitted seconds per F/B action (0 when the run was faster than ``base_s``).
        measured_s: per run, the median step of the tiny model's pipeline.
        base_s: the simulated step with no overhead (kernels and messages only).
        actions: the simulated step's growth per second of overhead (actions on its critical path).
        fitted_s: the simulated step with the fitted overhead (the measured median, unless that
            was below ``base_s``).
    """

    overhead_s: float
    measured_s: tuple[float, ...]
    base_s: float
    actions: float
    fitted_s: float


def _tiny_plan(n_ranks: int, micro: int, link: Link) -> tuple[LayerGraph, Plan, Profile]:
    """The tiny MLP, its 1F1B plan on ``micro`` one-sample micro-batches, and its profile."""
    graph = build_model("mlp", n_layers=2 * n_ranks, inputs=_PROBE_WIDTH, width=_PROBE_WIDTH,
                        hidden=_PROBE_WIDTH, classes=_PROBE_WIDTH)
    profile = measure_profile(graph, micro, sizes=(1,), progress=False)
    cost = CostModel(profile, Cluster.local(n_ranks, link=link))
    plan = build_balanced_plan(ModelRef.of(graph), cost, method=Method.ONE_F_ONE_B, n_stages=n_ranks,
                               batch_size=micro, n_micro=micro)
    return graph, plan, profile


def _simulated_s(plan: Plan, profile: Profile, link: Link, overhead_s: float, message_host: MessageHost) -> float:
    cluster = Cluster.local(plan.n_ranks, link=link, action_overhead_s=overhead_s, message_host=message_host)
    return simulate(build_schedule(plan), plan, CostModel(profile, cluster)).iteration_s


def probe_action_overhead(link: Link, n_ranks: int = 2, *, micro: int = 16, steps: int = 12,
                          runs: int = 3, message_host: MessageHost = NO_MESSAGE_HOST) -> OverheadProbe:
    """Measure the runtime's seconds per F/B action on ``n_ranks`` local ranks (module docstring).

    Args:
        link: the rank-to-rank link, as probed (messages are priced by it, not by the overhead).
        message_host: the ranks' host seconds per message, as probed (not counted in the overhead).
        n_ranks: ranks of the probe pipeline (one stage each).
        micro: one-sample micro-batches per step (more: more actions per step, a steadier fit).
        steps: timed steps per run (after 2 warm-up steps).
        runs: runs to take the median of, one after another in one launch of the ranks.
    """
    graph, plan, profile = _tiny_plan(n_ranks, micro, link)
    config = TrainConfig(steps=steps, warmup_steps=2, progress=False, threads_per_rank=1)
    jobs = [TrainJob(graph, plan, config)] * max(1, runs)  # one launch: the ranks start once
    measured = tuple(plan.batch_size / result.samples_per_s for result in train_many(jobs))
    base = _simulated_s(plan, profile, link, 0.0, message_host)
    actions = (_simulated_s(plan, profile, link, _SLOPE_STEP_S, message_host) - base) / _SLOPE_STEP_S
    overhead = max(0.0, (statistics.median(measured) - base) / actions)
    return OverheadProbe(overhead, measured, base, actions, _simulated_s(plan, profile, link, overhead, message_host))


def probe_local_cluster(n_ranks: int = 2, *, probes: int = 3, action_overhead_s: float | None = None,
                        model: Workload | None = None, link: Link | None = None,
                        collective: Link | None = None) -> Cluster:
    """This machine as a cluster of ``n_ranks`` CPU ranks: the link, contention and host seconds per
    message of :func:`~pipetrain.profile.link.probe_cluster` (on ``model``'s work when given; with
    ``link``, an earlier probe's link, and ``collective``, its all-reduce, only the contention is
    measured, and messages cost the ranks nothing), and the per-action overhead measured by
    :func:`probe_action_overhead` on 2 ranks unless ``action_overhead_s`` gives it."""
    cluster = probe_cluster(n_ranks, probes=probes, model=model, link=link, collective=collective)
    if action_overhead_s is None:
        action_overhead_s = probe_action_overhead(cluster.intra_node, message_host=cluster.message_host).overhead_s
        _warn_if_loaded(action_overhead_s)
    return replace(cluster, action_overhead_s=action_overhead_s)


def _warn_if_loaded(overhead_s: float) -> None:
    """A warning when the machine had more runnable processes than cores after the probe: each of the
    tiny model's many messages then waits for a core to wake its rank, which the fitted cost per action
    absorbs (5 ms per action at a load of 15 on 2 cores, against 0.1-0.3 ms on a quiet one), and every
    plan priced with it is predicted that much slower."""
    load, cores = load_average(), os.cpu_count() or 1
    if load is not None and load > cores:
        log.warning("probed under load %.1f on %d cores: the cost per action (%.0f us) counts the waits for a core "
                    "and will overprice plans of many actions; probe again on a quieter machine (`pipetrain plan "
                    "--reprobe`, or `pipetrain probe`)", load, cores, overhead_s * 1e6)
