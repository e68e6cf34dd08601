"""PipeDream planner: the hierarchical DP's stages and replicas as a synchronous plan, simulated.

PAPERS.md §2.3–2.4 (Narayanan et al., SOSP'19)::

    result = plan_pipedream(model=graph.name, fingerprint=graph.fingerprint(), layer_names=graph.names,
                            cost=CostModel(profile, Cluster.homogeneous("v100", 4, 4, nvlink, ethernet)),
                            batch_size=64)
    result.config, result.plan        # e.g. "15-1": stage 0 on 15 ranks, stage 1 on one

For each micro-batch count ``m`` (:func:`~pipetrain.plan.bapipe.thinned_counts`) the DP of
:func:`~pipetrain.plan.partition.pipedream.pipedream_partition` cuts the layers and replicates
stages on the cluster's two-level topology (devices in servers, servers in the cluster), with

* ``compute_s[l]``: layer ``l``'s forward + backward seconds on a micro-batch of ``ceil(B / m)``
  samples on the slowest device (PipeDream assumes identical workers; for mixed devices use the
  ``bapipe`` planner);
* ``sync_scale = 1 / m``: pipetrain's schedules are synchronous (PipeDream-Flush), so a replicated
  stage all-reduces once per ``m`` micro-batches, not once per item as PipeDream's asynchronous
  runtime does, and every replica pays the whole all-reduce (``synchronous``), not ``1/r`` of it;
* the memory check with :data:`~pipetrain.plan.microbatch.caps.SGD_STATE_COPIES` state copies and
  the smallest device's memory.

The DP's answer becomes a plan whose stage ``k`` runs on the DP's devices (replicas take
micro-batches round-robin, :meth:`~pipetrain.plan.plan.Plan.replica_rank`), simulated under GPipe and
1F1B by the event simulator, which also costs the fill and drain the DP's steady-state objective
leaves out, and checked against the devices' memory. Plain data parallelism (one stage on every
device) is simulated beside it at every count, since the steady state undersells it. The fastest
feasible candidate wins. A plan that leaves devices idle runs on the sub-cluster of the devices it
uses (ranks ``0..R-1``, as :meth:`Plan.validate` needs). Cost: per count, one DP (see its module
for the complexity) plus four event simulations.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.bapipe import thinned_counts
from pipetrain.plan.device_orders import placed_cluster
from pipetrain.plan.microbatch import SGD_STATE_COPIES, overflows
from pipetrain.plan.partition.pipedream import DPResult, DPStage, Level, MemoryLimit, pipedream_partition
from pipetrain.plan.plan import Method, Plan, Prediction, StagePlan, equal_sizes
from pipetrain.plan.planner import Candidate, rank_key
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate

__all__ = ["PipeDreamResult", "plan_pipedream", "topology"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipeDreamResult:
    """What :func:`plan_pipedream` found.

    Attributes:
        plan: the fastest feasible plan, with its prediction.
        cluster: the cluster its ranks index (a sub-cluster when the DP leaves devices idle).
        config: PipeDream's notation of its replication, e.g. ``"15-1"``.
        candidates: every simulated feasible candidate, fastest first.
        skipped: ``(micro-batch count, why)`` for counts with no runnable plan.
    """

    plan: Plan
    cluster: Cluster
    config: str
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[int, str], ...]


def topology(cluster: Cluster) -> list[Level]:
    """The cluster as PipeDream's levels, bottom-up: devices in a server over the intra-node link,
    servers over the inter-node link. Devices must be numbered server by server with the same count
    in each; otherwise one flat level over the (slower) inter-node link, a conservative view."""
    nodes = [d.node for d in cluster.devices]
    per_node = Counter(nodes)
    sizes = set(per_node.values())
    contiguous = nodes == sorted(nodes)
    intra, inter = cluster.intra_node, cluster.inter_node
    if len(per_node) == 1:
        return [Level(cluster.n_devices, intra.bandwidth_bytes_per_s, intra.latency_s)]
    if len(sizes) == 1 and contiguous:
        return [Level(sizes.pop(), intra.bandwidth_bytes_per_s, intra.latency_s),
                Level(len(per_node), inter.bandwidth_bytes_per_s, inter.latency_s)]
    return [Level(cluster.n_devices, inter.bandwidth_bytes_per_s, inter.latency_s)]


def _partition(cost: CostModel, layer_names: Sequence[str], batch_size: int, n_micro: int,
               straight: bool) -> DPResult:
    b = max(equal_sizes(batch_size, n_micro))
    cluster = cost.cluster
    slowest = min(range(cluster.n_devices), key=lambda r: (cluster.devices[r].speed, r))
    compute_s = [cost.forward_s((n,), b, slowest) + cost.backward_s((n,), b, slowest) - 2 * cost.action_overhead_s
                 for n in layer_names]
    memory = MemoryLimit(min(d.memory_bytes for d in cluster.devices),
                         [cost.saved_bytes((n,), b) for n in layer_names], SGD_STATE_COPIES)
    return pipedream_partition(
        compute_s, [cost.output_bytes((n,), b) for n in layer_names],
        [cost.parameter_bytes((n,)) for n in layer_names], topology(cluster),
        sync_scale=1.0 / n_micro, synchronous=True, straight=straight, memory=memory,
    )


def _plan(model: str, fingerprint: str, layer_names: Sequence[str], batch_size: int, n_micro: int,
          method: Method, dp: DPResult, cluster: Cluster) -> tuple[Plan, Cluster]:
    devices = [d for stage in dp.stages for d in stage.devices]
    sub, ranks = placed_cluster(cluster, devices)
    sizes = equal_sizes(batch_size, n_micro)
    stages, at = [], 0
    for stage in dp.stages:
        stages.append(StagePlan(tuple(layer_names[stage.first:stage.end]), tuple(ranks[at:at + stage.replicas]),
                                sizes, sizes))
        at += stage.replicas
    return Plan(model, fingerprint, batch_size, method, tuple(stages)), sub


def plan_pipedream(
    *,
    model: str,
    fingerprint: str,
    layer_names: Sequence[str],
    cost: CostModel,
    batch_size: int,
    methods: Sequence[Method] = (Method.GPIPE, Method.ONE_F_ONE_B),
    counts: Iterable[int] | None = None,
    straight: bool = False,
) -> PipeDreamResult:
    """The fastest feasible plan from PipeDream's DP over micro-batch counts and methods.

    Args:
        model, fingerprint, layer_names: the model (its layers in order).
        cost: profiles and the cluster (two levels: intra- and inter-node links).
        batch_size: samples per mini-batch.
        methods: the synchronous schedules to simulate each partition under.
        counts: micro-batch counts to try; default :func:`~pipetrain.plan.bapipe.thinned_counts`.
        straight: no replication (PipeDream's straight pipeline).

    Raises:
        UserError: no count gives a plan that fits the devices' memory (says what to change).
    """
    candidates: list[tuple[Candidate, Cluster, str]] = []
    skipped: list[tuple[int, str]] = []
    for m in counts if counts is not None else thinned_counts(batch_size):
        try:
            dp = _partition(cost, layer_names, batch_size, m, straight)
        except UserError as e:
            skipped.append((m, str(e)))
            continue
        options = [dp]
        devices = cost.cluster.n_devices
        if dp.config != str(devices) and m >= devices:  # data parallelism, which the DP's steady state may undersell
            options.append(DPResult((DPStage(0, len(layer_names), devices, tuple(range(devices))),), math.nan,
                                    str(devices)))
        for option, method in itertools.product(options, methods):
            if max(s.replicas for s in option.stages) > m:
                skipped.append((m, f"config {option.config} replicates a stage more times than there are "
                                   "micro-batches"))
                continue
            plan, cluster = _plan(model, fingerprint, layer_names, batch_size, m, method, option, cost.cluster)
            sub_cost = cost.on(cluster)
            timeline = simulate(build_schedule(plan), plan, sub_cost)
            plan = plan.with_prediction(Prediction(
                timeline.iteration_s, timeline.bubble_fraction(), timeline.peak_activation_bytes,
                f"pipedream {option.config}, simulated: profile {cost.profile.source} ({cost.profile.device}), "
                f"cluster {cluster.name}",
            ))
            over = overflows(plan, sub_cost)
            if over:
                skipped.append((m, f"{method.value}: stage {over[0][0]} over memory"))
                continue
            candidates.append((Candidate(plan, timeline.iteration_s), cluster, option.config))
    if not candidates:
        reasons = "; ".join(f"m={m}: {why}" for m, why in skipped[:3])
        raise UserError(f"the pipedream planner found no plan that fits ({reasons}); use a smaller batch, more "
                        "devices or devices with more memory")
    candidates.sort(key=lambda c: rank_key(c[0]))
    best, cluster, config = candidates[0]
    log.info("pipedream: chose %s, %s, %d micro-batches: %.6f s", config, best.plan.method.value,
             len(best.plan.stages[0].forward_sizes), best.iteration_s)
    return PipeDreamResult(best.plan, cluster, config, tuple(c for c, _, _ in candidates), tuple(skipped))
