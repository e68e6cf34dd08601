"""CostModel: Profile + Cluster → the seconds and bytes a planner or simulator needs.

A stage's time on ``b`` samples is the sum of its layers' profiled times at ``b``, divided by the
device's relative speed, plus a fixed per-action overhead (the runtime's own bookkeeping per
micro-batch). Transfers cost ``latency + bytes / bandwidth`` on the link between the two ranks. A
replicated stage all-reduces its gradients with a ring over its ranks (Patarasuk and Yuan 2009; the
data-parallel sync of PipeDream, docs/algorithms.md §3.2): ``2 (r - 1)`` steps, each moving ``bytes / r``
over the ring's slowest link, so ``2 (r - 1) · latency + 2 (r - 1) / r · bytes / bandwidth``; ranks of one
node use the probed all-reduce (``Cluster.collective``) as that link where the cluster has one. A tied
parameter (:class:`~pipetrain.profile.table.TiedBytes`) counts once in a stage holding several of its
layers, and costs the stages holding it such an all-reduce of its gradient over all their ranks
(:meth:`CostModel.tied_allreduce_s`).

A cost model is at one precision, its profiles' (:attr:`CostModel.precision`; all of them must agree).
Its byte counts are theirs, so at ``bf16``/``fp16`` a message between stages (an activation forward,
its gradient back) costs the compute dtype's bytes, ``message_bytes_factor(precision)`` = 1/2 of the
float32 bytes for a floating-point value (:mod:`pipetrain.profile.precision`; integer inputs such as
token ids keep their own), and stashed activations are the compute dtype's; parameter bytes (which
the replicas all-reduce as float32 gradients, and the optimizer steps) stay float32; what a
micro-batch keeps from F to B adds the compute-dtype casts of the stage's weights that autograd
saves (:meth:`CostModel.saved_bytes`). A plan is priced only by a cost model at its precision
(:func:`pipetrain.api.cost_of` checks it).

A cost model prices one optimizer's step (:attr:`CostModel.optimizer`; ``sgd`` by default) and
knows whether training clips the gradient norm (:attr:`CostModel.clip_grad_norm`): a stage's STEP
costs each layer's step of that optimizer, measured by the profile or else memory-bound
(:mod:`pipetrain.profile.optimizer_step`: passes × parameter bytes / bandwidth), plus, when
clipping, each layer's share of the norm and scaling (measured, else 3 passes over the gradients);
a rank's first STEP then also pays the norm's all-reduce of one float64 over the plan's ranks
(:meth:`CostModel.clip_allreduce_s`, latency-bound). A plan is priced with its own optimizer
(:attr:`~pipetrain.plan.plan.Plan.optimizer`; :func:`pipetrain.api.cost_of`).

For method ``local`` a cost model can also hold the auxiliary heads' profiles
(:meth:`CostModel.with_heads`, from :func:`~pipetrain.profile.heads.head_profiles`): a stage ending at
layer ``l`` then adds the head after ``l`` to its forward (:meth:`CostModel.head_forward_s`), backward
and optimizer step, and its F keeps the head's saved activations till its B
(:meth:`CostModel.head_saved_bytes`). Only the simulator of a local plan and the local planner ask for these.

A cost model also charges a rank for its own work on each message (:class:`~pipetrain.cluster.MessageHost`:
the cluster's, which ``pipetrain probe`` measures for CPU ranks, or :meth:`CostModel.with_message_host`'s):
the runtime's host seconds to post a send or take a receive (Python dispatch, the bounded queue's
hand-off) and, for messages staged through host memory, the copies. The event simulator then keeps
a SEND's rank busy for :meth:`CostModel.send_host_s` before the message goes on its link, and a
RECV's for :meth:`CostModel.recv_host_s` once it has arrived; the local planner weighs them in its
cuts. The vectorised and chain evaluators that other planners search with do not count them (a
plan they pick is then priced with them by the event simulator).
All zero by default: a message costs its ranks nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from pipetrain.cluster import Cluster, MessageHost, device_model
from pipetrain.errors import UserError
from pipetrain.profile.optimizer_step import CLIP_PASSES, STEP_PASSES, OptimizerName, memory_bound_s
from pipetrain.profile.precision import Precision
from pipetrain.profile.table import LayerProfile, Profile, TiedBytes

__all__ = ["CostModel", "MessageHost"]


class CostModel:
    """Costs of stages, transfers and memory for one model on one cluster.

    Args:
        profile: one profile for every device, or one per device kind (heterogeneous clusters).
        cluster: the devices (one per rank) and links.
        action_overhead_s: fixed seconds added to every compute action (F, B, W, STEP); defaults to
            the cluster's ``action_overhead_s``.
        optimizer: the optimizer whose step STEP costs (module docstring).
        clip_grad_norm: whether training clips the gradient norm (module docstring).
    """

    def __init__(
        self,
        profile: Profile | Mapping[str, Profile],
        cluster: Cluster,
        action_overhead_s: float | None = None,
        *,
        optimizer: OptimizerName = "sgd",
        clip_grad_norm: bool = False,
    ) -> None:
        self.profiles: dict[str, Profile] = (
            {d.kind: profile for d in cluster.devices} if isinstance(profile, Profile) else dict(profile)
        )
        missing = {d.kind for d in cluster.devices} - set(self.profiles)
        if missing:
            raise UserError(f"no profile for device kind(s) {sorted(missing)}; profile or estimate them")
        self.cluster = cluster
        self.action_overhead_s = cluster.action_overhead_s if action_overhead_s is None else action_overhead_s
        self.optimizer: OptimizerName = optimizer
        """The optimizer whose step STEP costs."""
        self.clip_grad_norm = clip_grad_norm
        """Whether STEP clips the gradient norm (its computation, and the all-reduce of :meth:`clip_allreduce_s`)."""
        self.profile = next(iter(self.profiles.values()))
        precisions = {p.precision for p in self.profiles.values()}
        if len(precisions) > 1:
            raise UserError(f"the device kinds' profiles are at different precisions "
                            f"({', '.join(sorted(precisions))}); profile or estimate each kind at the plan's precision")
        self.precision: Precision = self.profile.precision
        """The profiles' precision: their bytes' and times' (module docstring)."""
        self.forward_s = lru_cache(maxsize=None)(self._forward_s)
        self.backward_s = lru_cache(maxsize=None)(self._backward_s)
        self.backward_input_s = lru_cache(maxsize=None)(self._backward_input_s)
        self.weight_grad_s = lru_cache(maxsize=None)(self._weight_grad_s)
        self._saved: dict[tuple[str, ...], tuple[int, int]] = {}  # per stage: saved bytes per sample, weight casts
        self.heads: dict[str, Mapping[str, LayerProfile]] = {}
        self.message_host = cluster.message_host
        """The ranks' own seconds per message (:class:`~pipetrain.cluster.MessageHost`; the cluster's)."""

    def _copy(self, cluster: Cluster) -> CostModel:
        """The same profiles, per-action overhead, optimizer and message costs on ``cluster``, without heads."""
        copy = CostModel(self.profiles, cluster, self.action_overhead_s, optimizer=self.optimizer,
                         clip_grad_norm=self.clip_grad_norm)
        copy.message_host = self.message_host
        return copy

    def with_message_host(self, host: MessageHost) -> CostModel:
        """A copy whose ranks spend ``host``'s seconds on each message they send or receive (module docstring)."""
        copy = self.with_heads(self.heads)  # a copy, its heads and message costs as here
        copy.message_host = host
        return copy

    def send_host_s(self, n_bytes: float) -> float:
        """The sender's own seconds on a message of ``n_bytes`` (:class:`MessageHost`)."""
        return self.message_host.send_s + n_bytes * self.message_host.send_per_byte_s

    def recv_host_s(self, n_bytes: float) -> float:
        """The receiver's own seconds on a message of ``n_bytes`` (:class:`MessageHost`)."""
        return self.message_host.recv_s + n_bytes * self.message_host.recv_per_byte_s

    def on(self, cluster: Cluster) -> CostModel:
        """The same profiles, heads and per-action overhead on another cluster (e.g. the sub-cluster of
        the devices a plan uses); ``self`` when it is this model's cluster."""
        if cluster is self.cluster:
            return self
        return self._copy(cluster).with_heads(self.heads)

    def with_heads(self, heads: Mapping[str, Mapping[str, LayerProfile]]) -> CostModel:
        """A copy that counts auxiliary heads (method ``local``): per device kind, the head's profile
        after each layer but the last (:func:`~pipetrain.profile.heads.head_profiles`).

        Raises:
            UserError: no heads for a device kind of the cluster.
        """
        missing = {d.kind for d in self.cluster.devices} - set(heads)
        if heads and missing:
            raise UserError(f"no auxiliary head profiles for device kind(s) {sorted(missing)}; profile them too")
        copy = self._copy(self.cluster)
        copy.heads = {kind: dict(by_layer) for kind, by_layer in heads.items()}
        return copy

    def _head(self, layers: Sequence[str], rank: int) -> LayerProfile | None:
        """The head after the stage ending in ``layers[-1]`` on ``rank``'s device kind, if any."""
        by_layer = self.heads.get(self.cluster.devices[rank].kind)
        return None if by_layer is None else by_layer.get(layers[-1])

    def head_forward_s(self, layers: Sequence[str], b: int, rank: int) -> float:
        """Seconds of the forward and local loss of the head after ``layers`` (0 without one)."""
        head = self._head(layers, rank)
        return 0.0 if head is None else head.forward_at(b) / self.cluster.devices[rank].speed

    def head_backward_s(self, layers: Sequence[str], b: int, rank: int) -> float:
        """Seconds of the backward of the head after ``layers``, down to the stage's output (0 without one)."""
        head = self._head(layers, rank)
        return 0.0 if head is None else head.backward_at(b) / self.cluster.devices[rank].speed

    def head_saved_bytes(self, layers: Sequence[str], b: int) -> int:
        """Activation bytes the head after ``layers`` keeps from its forward to its backward on ``b``
        samples (0 without one): its saved bytes, less its input where the stage's last layer saves
        that tensor already (:meth:`saved_bytes` counts it). Heads of every device kind save alike."""
        by_layer = next(iter(self.heads.values()), {})
        head = by_layer.get(layers[-1])
        if head is None:
            return 0
        shared = min(self.profile.layer(layers[-1]).saved_output_bytes_per_sample, head.saved_input_bytes_per_sample)
        return (head.saved_bytes_per_sample - shared) * b

    def head_step_s(self, layers: Sequence[str], rank: int) -> float:
        """Seconds of the optimizer step of the head after ``layers`` (0 without one)."""
        head = self._head(layers, rank)
        return 0.0 if head is None else self._step_of([head], rank)

    def _layers(self, rank: int, layers: Sequence[str]) -> list[LayerProfile]:
        if not 0 <= rank < self.cluster.n_devices:
            raise UserError(
                f"rank {rank} has no device: the cluster has {self.cluster.n_devices}; "
                "give the cluster more devices or the plan fewer ranks"
            )
        profile = self.profiles[self.cluster.devices[rank].kind]
        return [profile.layer(name) for name in layers]

    def _forward_s(self, layers: tuple[str, ...], b: int, rank: int) -> float:
        """Seconds for forward of ``layers`` on ``b`` samples on ``rank``'s device."""
        work = sum(lp.forward_at(b) for lp in self._layers(rank, layers))
        return self.action_overhead_s + work / self.cluster.devices[rank].speed

    def _backward_s(self, layers: tuple[str, ...], b: int, rank: int, recompute: bool = False) -> float:
        """Seconds for backward (plus the forward re-run when ``recompute``)."""
        lps = self._layers(rank, layers)
        work = sum(lp.backward_at(b) + (lp.forward_at(b) if recompute else 0.0) for lp in lps)
        return self.action_overhead_s + work / self.cluster.devices[rank].speed

    def _backward_input_s(self, layers: tuple[str, ...], b: int, rank: int, recompute: bool = False) -> float:
        """Seconds of the input-gradient part (B) of a split backward (method zb1, Qi et al. 2024), plus
        the forward re-run when ``recompute`` (a recomputing stage re-runs forward before B; W then
        uses the graph B built and re-runs nothing)."""
        work = sum(lp.input_grad_at(b) + (lp.forward_at(b) if recompute else 0.0) for lp in self._layers(rank, layers))
        return self.action_overhead_s + work / self.cluster.devices[rank].speed

    def _weight_grad_s(self, layers: tuple[str, ...], b: int, rank: int) -> float:
        """Seconds of the weight-gradient part (W) of a split backward; B and W together cost the
        backward plus one more per-action overhead."""
        work = sum(lp.weight_grad_at(b) for lp in self._layers(rank, layers))
        return self.action_overhead_s + work / self.cluster.devices[rank].speed

    def layer_work_s(self, name: str, b: int, rank: int) -> float:
        """Forward + backward seconds of one layer on ``b`` samples on ``rank``'s device, without the
        per-action overhead: partitioners balance this, since a stage pays the overhead once, not
        once per layer."""
        return self.forward_s((name,), b, rank) + self.backward_s((name,), b, rank) - 2 * self.action_overhead_s

    def output_bytes(self, layers: Sequence[str], b: int) -> int:
        """Bytes a chain plan's stage ending in ``layers[-1]`` sends for ``b`` samples: everything
        crossing the cut after it (the last layer's output in a chain model)."""
        return self.profile.cut_bytes_per_sample(self._index(layers[-1])) * b

    def input_bytes(self, layers: Sequence[str], b: int) -> int:
        """Bytes of a chain plan's stage's input for ``b`` samples (its gradient has the same size)."""
        return self.profile.cut_bytes_per_sample(self._index(layers[0]) - 1) * b

    def edge_bytes(self, src: Sequence[str], dst: Sequence[str], b: int) -> int:
        """Bytes stage ``src`` sends stage ``dst`` for ``b`` samples in a plan whose stages form a DAG
        (the gradient going back has the same size)."""
        return self.profile.edge_bytes_per_sample(src, dst) * b

    def _index(self, name: str) -> int:
        return next(i for i, lp in enumerate(self.profile.layers) if lp.name == name)

    def transfer_s(self, n_bytes: float, src: int, dst: int) -> float:
        return self.cluster.link(src, dst).transfer_s(n_bytes)

    def allreduce_s(self, n_bytes: float, ranks: Sequence[int]) -> float:
        """Seconds for a ring all-reduce of ``n_bytes`` over ``ranks`` (0 for a single rank); on one node
        with a probed ``Cluster.collective``, its ring step, else the ring's slowest link's."""
        r = len(ranks)
        if r < 2:
            return 0.0
        one_node = len({self.cluster.devices[k].node for k in ranks}) == 1
        ring = ([self.cluster.collective] if one_node and self.cluster.collective is not None else
                [self.cluster.link(a, b) for a, b in zip(ranks, (*ranks[1:], ranks[0]), strict=True)])
        latency = max(link.latency_s for link in ring)
        bandwidth = min(link.bandwidth_bytes_per_s for link in ring)
        return 2 * (r - 1) * latency + 2 * (r - 1) / r * n_bytes / bandwidth

    def saved_bytes(self, layers: Sequence[str], b: int) -> int:
        """Activation bytes a stage keeps between forward and backward of ``b`` samples
        (:meth:`~pipetrain.profile.table.Profile.saved_bytes_per_sample`), plus under mixed precision
        the casts of its weights that the micro-batch's autograd graph keeps
        (:meth:`~pipetrain.profile.table.Profile.cast_weight_bytes`; 0 at fp32)."""
        key = tuple(layers)
        if key not in self._saved:
            self._saved[key] = (self.profile.saved_bytes_per_sample(layers), self.profile.cast_weight_bytes(layers))
        per_sample, casts = self._saved[key]
        return per_sample * b + casts

    def held_grad_bytes(self, layers: Sequence[str], b: int) -> int:
        """Bytes a stage keeps from a split backward's B of ``b`` samples to its W: the output gradients
        its W needs (:meth:`~pipetrain.profile.table.Profile.held_grad_bytes_per_sample`)."""
        return self.profile.held_grad_bytes_per_sample(layers) * b

    def parameter_bytes(self, layers: Sequence[str]) -> int:
        """Bytes of a stage's parameters: its layers', a parameter tied between several of them
        counted once (the stage holds one copy; each stage holding it holds its own)."""
        held = set(layers)
        shared = sum(max(len(held.intersection(t.layers)) - 1, 0) * t.parameter_bytes for t in self.profile.ties)
        return sum(self.profile.layer(n).parameter_bytes for n in layers) - shared

    def _spanning_ties(self, stages: Sequence[tuple[Sequence[str], Sequence[int]]]
                       ) -> list[tuple[TiedBytes, list[int], list[int]]]:
        """The tied parameters that two or more of ``stages`` (each: its layers and its ranks) hold,
        with those stages' indices and their ranks (the owners)."""
        out = []
        for tie in self.profile.ties:
            holding = [k for k, (layers, _) in enumerate(stages) if set(layers).intersection(tie.layers)]
            if len(holding) > 1:
                out.append((tie, holding, sorted({r for k in holding for r in stages[k][1]})))
        return out

    def tied_allreduce_s(self, stages: Sequence[tuple[Sequence[str], Sequence[int]]], rank: int) -> float:
        """Seconds ``rank`` spends before its first step summing the gradients of the tied parameters
        that two or more of ``stages`` (each: its layers and its ranks) hold: a ring all-reduce of each
        over its owners, every rank of every stage holding it (0 for one owner, or none held)."""
        return sum(self.allreduce_s(tie.parameter_bytes, owners)
                   for tie, _, owners in self._spanning_ties(stages) if rank in owners)

    def replica_bytes(self, stages: Sequence[tuple[Sequence[str], Sequence[int]]], k: int) -> int:
        """Bytes stage ``k``'s replicas all-reduce: its parameters but those tied to another stage
        (which its owners all-reduce instead, :meth:`tied_allreduce_s`)."""
        tied = sum(tie.parameter_bytes for tie, holding, _ in self._spanning_ties(stages) if k in holding)
        return self.parameter_bytes(stages[k][0]) - tied

    def step_s(self, layers: Sequence[str], rank: int) -> float:
        """Seconds for the optimizer step of the stage's parameters, with its share of clipping the
        gradient norm when :attr:`clip_grad_norm` (the all-reduce apart: :meth:`clip_allreduce_s`).

        Per layer, the profile's measured seconds for :attr:`optimizer` (divided by the device's
        speed), else a memory-bound estimate (module docstring); plus the per-action overhead, which
        the runtime pays at a STEP as at any other compute action (without it the flow benchmark's
        STEPs were predicted 26-35% short, benchmarks/history/cli-flow.md).
        """
        return self.action_overhead_s + self._step_of(self._layers(rank, layers), rank)

    def _step_of(self, lps: Sequence[LayerProfile], rank: int) -> float:
        """The optimizer step (and clipping's norm) of ``lps``' parameters on ``rank`` (:meth:`step_s`)."""
        device = self.cluster.devices[rank]
        bandwidth = device_model(device.kind).memory_bandwidth_bytes_per_s
        total = 0.0
        for lp in lps:
            measured = lp.step_for(self.optimizer)
            total += (measured / device.speed if measured is not None
                      else memory_bound_s(STEP_PASSES[self.optimizer], lp.parameter_bytes, bandwidth))
            if self.clip_grad_norm:
                clip = lp.clip_for()
                total += (clip / device.speed if clip is not None
                          else memory_bound_s(CLIP_PASSES, lp.parameter_bytes, bandwidth))
        return total

    def clip_allreduce_s(self, ranks: Sequence[int]) -> float:
        """Seconds of clipping's all-reduce of the squared norm (one float64) over ``ranks``, the plan's:
        latency-bound (:meth:`allreduce_s` of 8 bytes); 0 without :attr:`clip_grad_norm` or for one rank."""
        return self.allreduce_s(8, ranks) if self.clip_grad_norm else 0.0

    def forward_table(self, layers: Sequence[str], batch: int, rank: int) -> np.ndarray:
        """Forward seconds for every size ``0..batch`` as an array ``[batch + 1]`` (entry 0 is 0)."""
        key = tuple(layers)
        return np.array([0.0] + [self.forward_s(key, b, rank) for b in range(1, batch + 1)])

    def backward_table(self, layers: Sequence[str], batch: int, rank: int, recompute: bool = False) -> np.ndarray:
        key = tuple(layers)
        return np.array([0.0] + [self.backward_s(key, b, rank, recompute) for b in range(1, batch + 1)])
