"""A stage's time per sample and memory for GraphPipe's DP (GraphPipe §3.2, §3.4).

    est = StageEstimator(problem, layer_edges, b=4, n_micro=8)
    est.tps((0, 1, 3), replicas=2)      # seconds per sample of that stage on 2 devices
    est.fits((0, 1, 3), 2, depth=3)     # within the smallest device's memory at 3 in flight

For a stage of layer indices ``G`` on ``r`` devices (data parallel: the replicas take whole
micro-batches round-robin, :meth:`~pipetrain.plan.plan.Plan.replica_rank`) at micro-batch size ``b``
of a batch of ``B`` samples (§3.2, Eq. 1–2)::

    TPS(G, r) = ceil(m / r) · t_mb(G) / B + (t_allreduce(G, r) + t_step(G)) / B
    t_mb(G)   = t_fw(G, b) + t_bw(G, b) + t_comm(G, b)
    t_comm    = transfer(in_bytes(G) · b) + transfer(out_bytes(G) · b)
    Mem(G, r, k) = parameter_copies · W(G) + ceil(min(k, m) / r) · A(G, b)

with ``in_bytes`` the per-sample outputs of other layers that ``G`` reads (the model input is read
locally and costs nothing), ``out_bytes`` its layers' outputs read outside it, one transfer each way
over the link between devices 0 and 1 (the activation in forward and the gradient in backward of a
boundary share it: we count one of the two, since the simulator overlaps transfers with compute),
``k`` the in-flight micro-batches (§3.4: the stages on the longest path to the sink under 1F1B),
``m`` the micro-batch count, ``W`` parameter bytes and ``A`` saved activation bytes. The busiest of
``r`` replicas runs ``ceil(m / r)`` whole micro-batches (the paper's ``t_mb / (b · r)`` is the same
when ``r`` divides ``m``; 3 replicas of 16 micro-batches run 6, not 5.33: 12.5 % more, which made
the DP prefer such stages over the simulator's faster plans, issue 29). ``t_mb`` is also the stage's
*latency*, one micro-batch through it, which the DP sums along paths to break ties
(:mod:`.dp`). The all-reduce is priced on ``r`` devices that share nodes as far as they can
(:func:`~.stages.to_plan` places the stages that way). Times are on the
slowest device (GraphPipe assumes identical devices). Values are cached per stage: the binary
search asks the same stages again at every target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from pipetrain.plan.memory import parameter_copies
from pipetrain.planners.contract import PlanningProblem

__all__ = ["StageEstimator"]


class StageEstimator:
    """Cached TPS and memory of candidate stages at one micro-batch size.

    Args:
        problem: the model's names, the cost model, batch and optimizer.
        layer_edges: the DAG's ``(src, dst)`` layer-index pairs (the chain's for a chain model).
        b: the micro-batch size (the largest of the equal partition's sizes).
        n_micro: the micro-batch count ``m``.
    """

    def __init__(self, problem: PlanningProblem, layer_edges: Sequence[tuple[int, int]], b: int, n_micro: int) -> None:
        cost, cluster = problem.cost, problem.cost.cluster
        self.names = problem.layer_names
        self.cost, self.b, self.n_micro, self.batch = cost, b, n_micro, problem.batch_size
        self.rank = min(range(cluster.n_devices), key=lambda r: (cluster.devices[r].speed, r))
        self.memory_bytes = min(d.memory_bytes for d in cluster.devices)
        self.copies = parameter_copies(problem.optimizer)
        self.link = cluster.link(0, 1) if cluster.n_devices > 1 else None
        self.preds: list[list[int]] = [[] for _ in self.names]
        self.succs: list[list[int]] = [[] for _ in self.names]
        for a, c in layer_edges:
            self.preds[c].append(a)
            self.succs[a].append(c)
        self.out_bytes = [cost.profile.layer(n).output_bytes_per_sample for n in self.names]
        self.max_replicas = min(n_micro, cluster.n_devices)
        self.fits = lru_cache(maxsize=None)(self._fits)
        self.tps_row = lru_cache(maxsize=None)(self._tps_row)
        self.fewest_fitting = lru_cache(maxsize=None)(self._fewest_fitting)
        self.latency = lru_cache(maxsize=None)(self.latency_s)

    def _layer_names(self, layers: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.names[i] for i in layers)

    def comm_s(self, layers: tuple[int, ...]) -> float:
        """Seconds per micro-batch to receive the stage's inputs and send its outputs."""
        if self.link is None:
            return 0.0
        inside = set(layers)
        read = {p for i in layers for p in self.preds[i] if p not in inside}
        sent = [i for i in layers if any(s not in inside for s in self.succs[i])]
        total = 0.0
        for n_bytes in (sum(self.out_bytes[p] for p in read), sum(self.out_bytes[i] for i in sent)):
            if n_bytes:
                total += self.link.transfer_s(n_bytes * self.b)
        return total

    def latency_s(self, layers: tuple[int, ...]) -> float:
        """``t_mb``: seconds of one micro-batch's forward, backward and transfers on one replica."""
        names, b, rank = self._layer_names(layers), self.b, self.rank
        return self.cost.forward_s(names, b, rank) + self.cost.backward_s(names, b, rank) + self.comm_s(layers)

    def tps(self, layers: tuple[int, ...], replicas: int) -> float:
        """Seconds per sample of ``layers`` as one stage on ``replicas`` devices (module docstring)."""
        return self.tps_row(layers)[replicas - 1]

    def memory(self, layers: tuple[int, ...], replicas: int, depth: int) -> int:
        """Bytes one replica holds with ``depth`` micro-batches in flight on the stage."""
        names = self._layer_names(layers)
        in_flight = math.ceil(min(depth, self.n_micro) / replicas)
        return self.copies * self.cost.parameter_bytes(names) + in_flight * self.cost.saved_bytes(names, self.b)

    def _tps_row(self, layers: tuple[int, ...]) -> tuple[float, ...]:
        """``TPS(layers, r)`` for ``r = 1 .. max_replicas`` (at most ``m`` and the cluster's devices):
        the work once, the all-reduce per replica count."""
        names, m = self._layer_names(layers), self.n_micro
        work = self.latency(layers)
        step, weights = self.cost.step_s(names, self.rank), self.cost.parameter_bytes(names)
        return tuple((math.ceil(m / r) * work + self.cost.allreduce_s(weights, tuple(range(r))) + step) / self.batch
                     for r in range(1, self.max_replicas + 1))

    def balanced_tps(self, n_devices: int) -> float:
        """A lower bound of any strategy's bottleneck TPS on ``n_devices``: every layer's forward and
        backward spread evenly over them (a stage's TPS times its replicas is at least its layers' work)."""
        work = sum(self.cost.layer_work_s(name, self.b, self.rank) for name in self.names)
        return work / (self.b * n_devices)

    def _fewest_fitting(self, layers: tuple[int, ...], depth: int) -> int:
        """The fewest replicas within memory at ``depth`` in flight (fewer in flight each with more);
        ``max_replicas + 1`` when none fits."""
        r = 1
        while r <= self.max_replicas and not self.fits(layers, r, depth):
            r += 1
        return r

    def _fits(self, layers: tuple[int, ...], replicas: int, depth: int) -> bool:
        return self.memory(layers, replicas, depth) <= self.memory_bytes
