"""The inputs and output of PipeDream's partitioner (:mod:`pipetrain.planners.partition.pipedream`).

The topology, bottom-up (:class:`Level`), the optional per-device memory check
(:class:`DeviceMemoryLimit`), and the answer: flat stages (:class:`DPStage`) with the bottleneck
they reach (:class:`DPResult`). Values only; each checks its own fields where they can be wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipetrain.errors import UserError

__all__ = ["DPResult", "DPStage", "DeviceMemoryLimit", "Level"]


@dataclass(frozen=True)
class Level:
    """One level of the topology, bottom-up: level 1 = devices in a server, level 2 = servers...

    Attributes:
        machines: components of the level below in one component of this level (``m_k``).
        bandwidth_bytes_per_s: link bandwidth between those components (``B_k``).
        latency_s: per-message latency on that link.
        sync: the all-reduce's ring step on this level where it was measured apart from the link
            (``Cluster.collective``: on CPU gloo an all-reduce costs several times two messages);
            None: the link's bandwidth and latency.
    """

    machines: int
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    sync: tuple[float, float] | None = None  # (latency_s, bandwidth_bytes_per_s) of one ring step

    @property
    def sync_latency_s(self) -> float:
        return self.latency_s if self.sync is None else self.sync[0]

    @property
    def sync_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s if self.sync is None else self.sync[1]

    def __post_init__(self) -> None:
        if self.machines < 1:
            raise UserError(f"Level.machines={self.machines}: every level needs at least one machine")
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise UserError(f"Level.bandwidth_bytes_per_s={self.bandwidth_bytes_per_s}: give a positive bandwidth")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise UserError(f"Level.latency_s={self.latency_s}: give a latency >= 0 seconds")


@dataclass(frozen=True)
class DeviceMemoryLimit:
    """Per-device memory check: ``state_copies * params + in_flight * saved <= device_bytes``.

    Attributes:
        device_bytes: memory of one device.
        activation_bytes: per layer (length ``L``), bytes saved for backward per item.
        state_copies: how many parameter-sized buffers a device holds (weights, gradients,
            optimizer state, stashed versions), e.g. 4 for Adam.
    """

    device_bytes: float
    activation_bytes: Sequence[float]
    state_copies: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.device_bytes) and self.device_bytes > 0):
            raise UserError(f"DeviceMemoryLimit.device_bytes={self.device_bytes}: give one device's bytes (> 0)")
        if not (math.isfinite(self.state_copies) and self.state_copies >= 0):
            raise UserError(f"DeviceMemoryLimit.state_copies={self.state_copies}: give a count >= 0 (4 for Adam)")


@dataclass(frozen=True)
class DPStage:
    """A stage of the flattened result: layers ``[first, end)`` data parallel on ``replicas`` devices.

    ``devices`` names them, numbered server-major as the levels nest (device ``d`` of server ``s``
    with ``n`` devices per server is ``s * n + d``): a flat stage that came from a level-1 stage
    of a top stage on several servers has its devices in each of those servers.
    """

    first: int
    end: int
    replicas: int
    devices: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class DPResult:
    """The partitioner's answer.

    Attributes:
        stages: flat stages in pipeline order.
        bottleneck_s: the DP's objective, seconds per item of the slowest stage (comm included).
        config: PipeDream's notation, replicas per stage joined by ``-`` (``"15-1"``).
    """

    stages: tuple[DPStage, ...]
    bottleneck_s: float
    config: str

    @property
    def devices(self) -> int:
        """Devices the plan uses (at most the cluster's)."""
        return sum(stage.replicas for stage in self.stages)

    @property
    def noam(self) -> int:
        """Items admitted at start-up, ``ceil(devices / replicas of the input stage)`` (docs/algorithms.md §3.3)."""
        return -(-self.devices // self.stages[0].replicas)
