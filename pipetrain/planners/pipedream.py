"""PipeDream planner: the hierarchical DP's stages and replicas as a synchronous plan, simulated.

docs/algorithms.md §3.3 (Narayanan et al., SOSP'19)::

    cost = CostModel(profile, Cluster.homogeneous("v100", 4, 4, nvlink, ethernet))
    result = plan_pipedream(PlanningProblem(ModelRef.of(graph), cost, batch_size=64))
    result.plan, result.report.config     # e.g. "15-1": stage 0 on 15 ranks, stage 1 on one

For each micro-batch count ``m`` (:func:`~pipetrain.planners.counts.thinned_counts`) the DP of
:func:`~pipetrain.planners.partition.pipedream.pipedream_partition` cuts the layers and replicates
stages on the cluster's two-level topology (devices in servers, servers in the cluster), with

* ``compute_s[l]``: layer ``l``'s forward + backward seconds on a micro-batch of ``ceil(B / m)``
  samples on the slowest device (PipeDream assumes identical workers; for mixed devices use the
  ``bapipe`` planner);
* ``sync_scale = 1 / m``: pipetrain's schedules are synchronous (PipeDream-Flush), so a replicated
  stage all-reduces once per ``m`` micro-batches, not once per item as PipeDream's asynchronous
  runtime does, and every replica pays the whole all-reduce (``synchronous``), not ``1/r`` of it;
* the memory check with the problem's optimizer's
  :func:`~pipetrain.plan.memory.parameter_copies` and the smallest device's memory.

The DP's answer becomes a plan whose stage ``k`` runs on the DP's devices (replicas take
micro-batches round-robin, :meth:`~pipetrain.plan.plan.Plan.replica_rank`), simulated under GPipe
and 1F1B by the event simulator (:func:`~pipetrain.planners.score.score`), which also costs the fill
and drain the DP's steady-state objective leaves out, and checked against the devices' memory. Plain
data parallelism (one stage on every device) is simulated beside it at every count, since the steady
state undersells it. The fastest feasible candidate wins. A plan that leaves devices idle runs on
the sub-cluster of the devices it uses (ranks ``0..R-1``, as :meth:`Plan.validate` needs). Cost: per
count, one DP (see its module for the complexity) plus four event simulations.

With ``constraints.method = pipedream`` the plan is PipeDream's own, asynchronous one
(:func:`async_candidates_at`): the DP with the paper's objective (``sync_scale = 1``, replicas
sharing the sync, no flush), its straight pipeline, and plain data parallelism (PipeDream's config
``"D"``: one stage on every device, each replica's micro-batch its own mini-batch, one all-reduce per
step), all run by ``pipedream`` (weight stashing, 1F1B-RR; any stage may be replicated, the last one
too) and scored by the same steady state (:func:`~pipetrain.simulate.steady.steady_state`); counts
not a multiple of every replica count are skipped. The paper's optimizer answers ``"16"`` (data
parallelism) for ResNet-50 on 16 V100s; so does this one where data parallelism is fastest."""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.plan.memory import parameter_copies
from pipetrain.plan.methods import METHODS, Method, MethodSpec, StageGraph, WeightPolicy
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.planners.contract import Candidate, PlanningProblem, PlanningResult, rank_key
from pipetrain.planners.counts import thinned_counts
from pipetrain.planners.device_orders import placed_cluster
from pipetrain.planners.partition.pipedream import DeviceMemoryLimit, DPResult, DPStage, Level, pipedream_partition
from pipetrain.planners.report import CandidatesPart, NotePart, PlanPart
from pipetrain.planners.score import memory_checked, score, score_steady
from pipetrain.planners.spec import planned_methods

__all__ = ["PipeDreamReport", "async_candidates_at", "data_parallel", "pipedream_layout", "pipedream_plans",
           "plan_pipedream", "topology"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipeDreamReport:
    """PipeDream's own account of its answer.

    Attributes:
        config: PipeDream's notation of the chosen replication, e.g. ``"15-1"``.
        skipped: ``(micro-batch count, why)`` for options with no runnable plan.
    """

    config: str
    skipped: tuple[tuple[int, str], ...]


def topology(cluster: Cluster, *, flat: bool = False) -> list[Level]:
    """The cluster as PipeDream's levels, bottom-up: devices in a server over the intra-node link,
    servers over the inter-node link (a probed ``Cluster.collective`` prices the gradient sync inside a
    server). Devices must be numbered server by server with the same count
    in each; otherwise, or with ``flat``, one flat level over the (slower) inter-node link, a
    conservative view. The hierarchy's stages replicate in whole servers' worth (a top stage on ``m``
    servers runs each server's sub-pipeline, so a flat stage has ``r·m`` replicas): on 4 servers of 4,
    PipeDream's "15-1" (VGG-16 on cluster A) is only reachable flat."""
    nodes = [d.node for d in cluster.devices]
    per_node = Counter(nodes)
    sizes = set(per_node.values())
    contiguous = nodes == sorted(nodes)
    intra, inter = cluster.intra_node, cluster.inter_node
    sync = None if cluster.collective is None else (cluster.collective.latency_s,
                                                    cluster.collective.bandwidth_bytes_per_s)
    if len(per_node) == 1:
        return [Level(cluster.n_devices, intra.bandwidth_bytes_per_s, intra.latency_s, sync)]
    if len(sizes) == 1 and contiguous and not flat:
        return [Level(sizes.pop(), intra.bandwidth_bytes_per_s, intra.latency_s, sync),
                Level(len(per_node), inter.bandwidth_bytes_per_s, inter.latency_s)]
    return [Level(cluster.n_devices, inter.bandwidth_bytes_per_s, inter.latency_s)]


def _partition(problem: PlanningProblem, n_micro: int, straight: bool, asynchronous: bool = False,
               flat: bool = False) -> DPResult:
    """The DP at ``n_micro`` micro-batches: a synchronous (flush) objective, or with ``asynchronous``
    PipeDream's own (one weight sync per item, each replica paying its share; §3.3 of the paper); on
    the cluster's hierarchy, or ``flat`` (:func:`topology`)."""
    b = max(equal_sizes(problem.batch_size, n_micro))
    cost, names = problem.cost, problem.layer_names
    cluster = cost.cluster
    slowest = min(range(cluster.n_devices), key=lambda r: (cluster.devices[r].speed, r))
    memory = DeviceMemoryLimit(min(d.memory_bytes for d in cluster.devices),
                               [cost.saved_bytes((n,), b) for n in names], parameter_copies(problem.optimizer))
    return pipedream_partition(
        [cost.layer_work_s(n, b, slowest) for n in names], [cost.output_bytes((n,), b) for n in names],
        [cost.parameter_bytes((n,)) for n in names], topology(cluster, flat=flat),
        sync_scale=1.0 if asynchronous else 1.0 / n_micro, synchronous=not asynchronous, straight=straight,
        memory=memory,
    )


def _plan(problem: PlanningProblem, n_micro: int, method: Method, dp: DPResult) -> tuple[Plan, Cluster]:
    devices = [d for stage in dp.stages for d in stage.devices]
    sub, ranks = placed_cluster(problem.cost.cluster, devices)
    sizes = equal_sizes(problem.batch_size, n_micro)
    names, stages, at = problem.layer_names, [], 0
    for stage in dp.stages:
        stages.append(StagePlan(names[stage.first:stage.end], tuple(ranks[at:at + stage.replicas]), sizes, sizes))
        at += stage.replicas
    model = problem.model
    return Plan(model.name, model.fingerprint, problem.batch_size, method, tuple(stages)), sub


def data_parallel(problem: PlanningProblem) -> DPResult:
    """Plain data parallelism as a DP answer: one stage of every layer on every device (config ``"D"``)."""
    devices = problem.cost.cluster.n_devices
    return DPResult((DPStage(0, len(problem.layer_names), devices, tuple(range(devices))),), math.nan, str(devices))


def _options(problem: PlanningProblem, dp: DPResult, n_micro: int, straight: bool) -> list[DPResult]:
    """The DP's answer and, when it differs, there are enough micro-batches and replication is allowed
    (not ``straight``), plain data parallelism (:func:`data_parallel`), which the DP's steady state
    may undersell."""
    devices = problem.cost.cluster.n_devices
    if straight or dp.config == str(devices) or n_micro < devices:
        return [dp]
    return [dp, data_parallel(problem)]


def _candidates_at(problem: PlanningProblem, n_micro: int, methods: Sequence[Method], straight: bool,
                   skipped: list[tuple[int, str]]) -> list[Candidate]:
    """The scored, memory-checked plans at one micro-batch count; reasons for the rest in ``skipped``."""
    try:
        dp = _partition(problem, n_micro, straight)
    except UserError as e:
        skipped.append((n_micro, str(e)))
        return []
    found = []
    for option, method in itertools.product(_options(problem, dp, n_micro, straight), methods):
        if max(s.replicas for s in option.stages) > n_micro:
            skipped.append((n_micro, f"config {option.config} replicates a stage more times than there are "
                                     "micro-batches"))
            continue
        plan, cluster = _plan(problem, n_micro, method, option)
        sub_cost = problem.cost.on(cluster)
        candidate = memory_checked(score(plan, sub_cost, label=f"pipedream {option.config}"), sub_cost,
                                   problem.optimizer)
        if not candidate.feasible:
            skipped.append((n_micro, f"{method.value}: {candidate.infeasible}"))
            continue
        found.append(candidate)
    return found


def _async_options(problem: PlanningProblem, n_micro: int, straight: bool,
                   skipped: list[tuple[int, str]]) -> list[DPResult]:
    """The DP's answers with PipeDream's objective: on the cluster's hierarchy and flat (where it
    differs: :func:`topology`), with replication unless ``straight`` and without; and plain data
    parallelism (unless ``straight``; when every device gets whole micro-batches). The DP's failures
    go to ``skipped``."""
    hierarchy = len(topology(problem.cost.cluster)) > 1
    options = []
    for no_replicas, flat in dict.fromkeys([(straight, False), (straight, True), (True, False)]):
        if flat and not hierarchy:
            continue
        try:
            options.append(_partition(problem, n_micro, no_replicas, asynchronous=True, flat=flat))
        except UserError as e:
            skipped.append((n_micro, str(e)))
    everywhere = not straight and n_micro % problem.cost.cluster.n_devices == 0
    return [*options, data_parallel(problem)] if everywhere else options


def async_candidates_at(problem: PlanningProblem, n_micro: int, straight: bool,
                        skipped: list[tuple[int, str]]) -> list[Candidate]:
    """``pipedream`` plans at ``n_micro`` micro-batches: the DP's with PipeDream's own objective (no
    flush: a weight sync per item), its straight pipeline and plain data parallelism
    (:func:`_async_options`), run by 1F1B-RR (``n_micro`` a multiple of every replica count), scored
    by their steady state (:func:`~pipetrain.planners.score.score_steady`) and memory-checked with the
    stashed versions."""
    found: list[Candidate] = []
    seen: set[str] = set()
    for option in _async_options(problem, n_micro, straight, skipped):
        bad = [s.replicas for s in option.stages if n_micro % s.replicas]
        if option.config in seen or bad:
            if bad:
                skipped.append((n_micro, f"config {option.config}: {bad[0]} replicas do not divide {n_micro} "
                                          "micro-batches (1F1B-RR)"))
            continue
        seen.add(option.config)
        plan, cluster = _plan(problem, n_micro, Method.PIPEDREAM, option)
        sub_cost = problem.cost.on(cluster)
        candidate = memory_checked(score_steady(plan.run_by(Method.PIPEDREAM), sub_cost,
                                                label=f"pipedream {option.config}"), sub_cost, problem.optimizer)
        if candidate.feasible:
            found.append(candidate)
        else:
            skipped.append((n_micro, f"pipedream {option.config}: {candidate.infeasible}"))
    return found


def pipedream_plans(spec: MethodSpec) -> bool:
    """The methods the pipedream planner plans: those that run replicated stages along a chain (its DP
    replicates stages) with one weight version or PipeDream's stashing: gpipe and 1f1b by default,
    pipedream (asynchronous) when asked. 2BW's double buffering has its own planner (``2bw``)."""
    return spec.replicas and spec.graph is StageGraph.CHAIN and WeightPolicy.TWO_BW not in spec.weights


def plan_pipedream(
    problem: PlanningProblem,
    *,
    methods: Sequence[Method] | None = None,
    counts: Iterable[int] | None = None,
    straight: bool = False,
) -> PlanningResult:
    """The fastest feasible plan from PipeDream's DP over micro-batch counts and methods.

    Args:
        problem: the model, cost model (two levels: intra- and inter-node links), batch and optimizer.
        methods: the synchronous schedules to simulate each partition under (default: those of
            :func:`pipedream_plans` with a flush, gpipe and 1f1b); ``constraints.method`` picks one
            of them, or an asynchronous one (``pipedream``) for PipeDream's asynchronous plan
            (:func:`async_candidates_at`).
        counts: micro-batch counts to try; default :func:`~pipetrain.planners.counts.thinned_counts`.
        straight: no replication (PipeDream's straight pipeline).

    Returns:
        The plan, its (sub-)cluster, every feasible candidate fastest first, and a
        :class:`PipeDreamReport` (the chosen replication, the options skipped and why).

    Raises:
        UserError: a method it does not plan, or no count gives a plan that fits the devices' memory
            (says what to change).
    """
    fixed = problem.constraints.method
    planned = planned_methods(pipedream_plans)
    if fixed is not None and not pipedream_plans(METHODS[fixed]):
        asynchronous = " or ".join(m.value for m in planned if not METHODS[m].flush)
        raise UserError(f"the pipedream planner plans {', '.join(m.value for m in planned[:-1])} or "
                        f"{planned[-1].value}, not {fixed.value}; drop --method or use --method {asynchronous} for "
                        "its asynchronous plan")
    synchronous = [fixed] if fixed is not None else (
        list(methods) if methods is not None else [m for m in planned if METHODS[m].flush])
    candidates: list[Candidate] = []
    skipped: list[tuple[int, str]] = []
    for m in counts if counts is not None else thinned_counts(problem.batch_size, problem.smallest_microbatch):
        if fixed is not None and not METHODS[fixed].flush:
            candidates += async_candidates_at(problem, m, straight, skipped)
        else:
            candidates += _candidates_at(problem, m, synchronous, straight, skipped)
    return _result(candidates, skipped)


def _result(candidates: list[Candidate], skipped: list[tuple[int, str]]) -> PlanningResult:
    """The fastest candidate with PipeDream's report.

    Raises:
        UserError: no candidate; names the first reasons.
    """
    if not candidates:
        reasons = "; ".join(f"m={m}: {why}" for m, why in skipped[:3])
        raise UserError(f"the pipedream planner found no plan that fits ({reasons}); use a smaller batch, more "
                        "devices or devices with more memory")
    candidates.sort(key=rank_key)
    best = candidates[0]
    assert best.cluster is not None
    config = best.label.removeprefix("pipedream ").split(" ")[0]
    log.info("pipedream: chose %s, %s, %d micro-batches: %.6f s", config, best.plan.method.value,
             len(best.plan.stages[0].forward_sizes), best.iteration_s)
    return PlanningResult("pipedream", best.plan, best.cluster, tuple(candidates),
                          PipeDreamReport(config, tuple(skipped)))


def pipedream_layout(result: PlanningResult) -> tuple[object, ...]:
    """The plan, PipeDream's configuration (replicas per stage) and its candidates."""
    assert isinstance(result.report, PipeDreamReport)
    return (PlanPart(result.plan), NotePart(f"PipeDream configuration {result.report.config} (replicas per stage)"),
            CandidatesPart(result.candidates, "pipedream candidates"))
