"""Cluster: the devices a plan runs on and the links between them (docs/architecture.md §2).

Devices are grouped into nodes; a link's latency and bandwidth depend only on whether the two
devices share a node (a two-level hierarchy, as in PipeDream's topology). Device *models* give the
peak numbers that the estimator turns into a Profile for hardware we do not have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic

__all__ = ["CPU_ACTION_OVERHEAD_S", "DEVICE_MODELS", "NO_MESSAGE_HOST", "Cluster", "Device", "DeviceModel", "Link",
           "MessageHost", "device_model"]

GiB = 1 << 30

# pipetrain's runtime cost per F or B action on a CPU rank (Python dispatch, buffers, hooks):
# measured on the project's 2-core machine as the median residual of measured minus profiled
# action times (gpt-tiny, 8 micro-batches; see benchmarks/history/core.md). Used for local clusters.
CPU_ACTION_OVERHEAD_S = 2.5e-4


@dataclass(frozen=True)
class DeviceModel:
    """Peak capabilities of a device class, for estimated profiles.

    The estimator prices a kernel's FLOPs at the peak of the profile's precision
    (:func:`~pipetrain.profile.estimate.peak_flops`): ``peak_flops`` for fp16, ``bf16_peak_flops``
    for bf16 and ``fp32_peak_flops`` for fp32, a missing one being ``peak_flops`` (a device without
    separate half-precision units, or a model that does not tell them apart).

    Attributes:
        name: short name (``"v100"``).
        peak_flops: sustained dense half-precision (fp16) throughput: a GPU's tensor cores (FLOP/s).
        memory_bandwidth_bytes_per_s: device memory bandwidth (B/s).
        kernel_overhead_s: fixed cost per kernel launch (s).
        memory_bytes: device memory.
        saturation_flops: work per kernel below which the device is under-used; kernels smaller
            than this cost as much as one of this size (models poor utilisation at small batches).
        fp32_peak_flops: sustained dense float32 throughput (None: ``peak_flops``).
        bf16_peak_flops: sustained dense bfloat16 throughput (None: ``peak_flops``).
        host_dispatch_s: host (CPU) seconds to issue one kernel: the framework's eager dispatch
            and the launch call, paid on the CPU while the device runs earlier kernels (0: the host
            is the device, as on ``"cpu"``, where ``kernel_overhead_s`` is that cost).
        host_bandwidth_bytes_per_s: host-to-device copy bandwidth (the PCIe link) for a micro-batch's
            inputs and targets (None: the data is already on the device, as on ``"cpu"``).
    """

    name: str
    peak_flops: float
    memory_bandwidth_bytes_per_s: float
    kernel_overhead_s: float
    memory_bytes: int
    saturation_flops: float
    fp32_peak_flops: float | None = None
    bf16_peak_flops: float | None = None
    host_dispatch_s: float = 0.0
    host_bandwidth_bytes_per_s: float | None = None


# Sustained (not datasheet) figures. For the GPUs, a fixed fraction of each datasheet's dense peaks,
# the same for every precision of one GPU, so that fp32 and fp16/bf16 estimates differ by the
# datasheets' ratio (NVIDIA data sheets; dense, without the 2:4 sparsity the Ampere/Hopper sheets
# also quote):
#   V100 SXM2 32 GB: FP16 tensor cores 125 TFLOP/s, FP32 15.7; no bfloat16 units (bf16 runs at the
#     FP32 rate); 900 GB/s. Fraction 0.64: 8.0e13 fp16, 1.0e13 fp32 and bf16.
#   A100 SXM4 80 GB: BF16/FP16 tensor cores 312 TFLOP/s, FP32 19.5 (TF32 tensor cores 156); 2.0 TB/s.
#     Fraction 0.64: 2.0e14 bf16/fp16, 1.25e13 fp32.
#   H100 SXM5 80 GB: BF16/FP16 tensor cores 989 TFLOP/s, FP32 67 (TF32 495); 3.35 TB/s.
#     Fraction 0.51: 5.0e14 bf16/fp16, 3.4e13 fp32.
# fp32 is the CUDA-core FP32 peak, not TF32: PyTorch has run float32 matmuls without TF32 by default
# since 1.12 (torch.backends.cuda.matmul.allow_tf32 = False). cuDNN convolutions do default to TF32
# on A100/H100 (torch.backends.cudnn.allow_tf32 = True), so fp32 convolutions there are estimated slow.
# Memory bandwidths are about 80-90% of the sheets' (V100 8.0e11, A100 1.6e12, H100 2.6e12 B/s).
# "cpu" is a single core's worth at every precision (one thread of a recent x86 core: float32 GEMMs
# measured at 1.0-1.3e11 FLOP/s, streaming reads at 2-3e10 B/s). bf16 is no faster on such a core:
# this machine's (AVX-512 BF16, no AMX) ran gpt-tiny under bf16 autocast 1-3x slower than in fp32 at
# 8-32 samples, autocast's casts costing more than the matmuls save.
# "fpga" is an Alveo U280-class card, for BaPipe's simulated FPGA clusters (docs/algorithms.md §4): about 40% of
# the U280 data sheet's 24.5 INT8 TOPS, as a low-precision systolic design sustains it; its 8 GiB of
# HBM2 at the 4.25e11 B/s (of 460 GB/s nominal) that Shuhai measured on a U280 (Wang et al., FCCM 2020);
# and a dataflow pipeline that is full at small work (low saturation) with little per-kernel overhead.
# Host dispatch on the GPUs (an assumption inside a cited range): 10 µs of CPU per kernel. Meta's
# Holistic Trace Analysis documentation puts the CPU side of a CUDA kernel launch (cudaLaunchKernel)
# at "usually between 5-20 microseconds" (facebookresearch/HolisticTraceAnalysis, docs "CUDA kernel
# launch stats"); PyTorch's operator micro-benchmarks show about 3 µs of eager framework overhead per
# op on top (pytorch/pytorch#32194), and Fernandez et al., "The Framework Tax" (EMNLP 2023), find
# eager PyTorch framework-bound at small batches on such GPUs. Host links: PCIe 3.0 x16 (V100 SXM2
# hosts, 15.75 GB/s), 4.0 (A100, 31.5) and 5.0 (H100, 63), at about 80% of the nominal rate.
DEVICE_MODELS: dict[str, DeviceModel] = {
    "cpu": DeviceModel("cpu", 1.0e11, 2.0e10, 5e-6, 16 * GiB, 1.0e5),
    "v100": DeviceModel("v100", 8.0e13, 8.0e11, 6e-6, 32 * GiB, 2.0e8, fp32_peak_flops=1.0e13, bf16_peak_flops=1.0e13,
                        host_dispatch_s=1e-5, host_bandwidth_bytes_per_s=1.25e10),
    "a100": DeviceModel("a100", 2.0e14, 1.6e12, 5e-6, 80 * GiB, 5.0e8, fp32_peak_flops=1.25e13,
                        host_dispatch_s=1e-5, host_bandwidth_bytes_per_s=2.5e10),
    "h100": DeviceModel("h100", 5.0e14, 2.6e12, 4e-6, 80 * GiB, 1.2e9, fp32_peak_flops=3.4e13,
                        host_dispatch_s=1e-5, host_bandwidth_bytes_per_s=5.0e10),
    "fpga": DeviceModel("fpga", 1.0e13, 4.25e11, 2e-6, 8 * GiB, 1.0e6),
}


def device_model(name: str) -> DeviceModel:
    """The model named ``name``, or the model of a named device kind (``"v100#big"`` is a ``"v100"``)."""
    try:
        return DEVICE_MODELS[name.lower().partition("#")[0]]
    except KeyError:
        known = ", ".join(DEVICE_MODELS)
        raise UserError(f"unknown device model {name!r}; choose one of: {known}") from None


@dataclass(frozen=True)
class Link:
    """A point-to-point link: ``transfer_s(n) = latency_s + n / bandwidth_bytes_per_s``."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def transfer_s(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Device:
    """One device (one rank).

    Attributes:
        kind: device class (``"cpu"``, ``"v100"``...), matched against the profile's device.
        memory_bytes: memory available to the rank.
        speed: throughput relative to the device the profile describes (0.86 means 14% slower,
            e.g. when ranks share a machine's memory bandwidth).
        node: index of the node (server) the device sits in.
    """

    kind: str
    memory_bytes: int
    speed: float = 1.0
    node: int = 0


@dataclass(frozen=True)
class MessageHost:
    """Host seconds a rank spends on each message it sends or receives, ``fixed + bytes · per_byte``
    on either side: the runtime's own work to post a send (Python dispatch, gloo's hand-off to its
    socket thread) or to take a receive (its completion, posting the next one), and for messages
    staged through host memory the copies. The event simulator keeps the rank busy for it
    (:meth:`~pipetrain.cost.CostModel.send_host_s`); ``pipetrain probe`` measures it on gloo between
    local ranks (:mod:`pipetrain.profile.link`). All zero: a message costs its ranks nothing.

    Attributes:
        send_s: the sender's fixed seconds per message (posting it, the queue's bookkeeping).
        recv_s: the receiver's fixed seconds per message (taking it, posting the next receive).
        send_per_byte_s: the sender's seconds per byte (copies it makes: to host memory, into a socket).
        recv_per_byte_s: the receiver's seconds per byte.
    """

    send_s: float = 0.0
    recv_s: float = 0.0
    send_per_byte_s: float = 0.0
    recv_per_byte_s: float = 0.0

    def __post_init__(self) -> None:
        values = (self.send_s, self.recv_s, self.send_per_byte_s, self.recv_per_byte_s)
        if not all(0 <= v and math.isfinite(v) for v in values):
            raise UserError(f"message host costs must be finite and >= 0, got {self}; give seconds and seconds per "
                            "byte >= 0 (or re-create the cluster with `pipetrain probe`)")


NO_MESSAGE_HOST = MessageHost()
"""Messages cost their ranks nothing (a cluster's default; not measured)."""

MAX_DEVICES = 1 << 16
"""The most devices (ranks) a cluster may have: more is a typo, and would not fit in memory."""


def _link(data: Mapping[str, Any]) -> Link:
    """A link of a cluster file: ``{"latency_s": ..., "bandwidth_bytes_per_s": ...}``."""
    return Link(float(data["latency_s"]), float(data["bandwidth_bytes_per_s"]))


def _check_cluster(cluster: Cluster) -> None:
    """A cluster file's numbers: memory and speeds > 0, node numbers >= 0, finite latencies >= 0 and bandwidths > 0."""
    finite = math.isfinite
    for i, d in enumerate(cluster.devices):
        if not (d.memory_bytes > 0 and 0 < d.speed and finite(d.speed) and 0 <= d.node < MAX_DEVICES):
            raise UserError(f"cluster JSON devices[{i}]: memory_bytes {d.memory_bytes}, speed {d.speed}, node "
                            f"{d.node}: need memory_bytes > 0, a finite speed > 0 and a node in 0..{MAX_DEVICES - 1}; "
                            "re-create it with `pipetrain probe`")
    links = (("intra_node", cluster.intra_node), ("inter_node", cluster.inter_node), ("collective", cluster.collective))
    for name, link in ((n, k) for n, k in links if k is not None):
        if not (0 <= link.latency_s and finite(link.latency_s) and 0 < link.bandwidth_bytes_per_s
                and finite(link.bandwidth_bytes_per_s)):
            raise UserError(f"cluster JSON {name}: latency_s {link.latency_s}, bandwidth_bytes_per_s "
                            f"{link.bandwidth_bytes_per_s}: need a finite latency >= 0 and bandwidth > 0")
    if not (0 <= cluster.action_overhead_s and finite(cluster.action_overhead_s)):
        raise UserError(f"cluster JSON: action_overhead_s is {cluster.action_overhead_s}; give finite seconds >= 0")
    if not all(0 < x and finite(x) for x in cluster.shared_speed):
        raise UserError(f"cluster JSON: shared_speed {list(cluster.shared_speed)} must be finite speeds > 0")


@dataclass(frozen=True)
class Cluster:
    """Devices and links.

    Attributes:
        devices: one per rank, indexed by rank.
        intra_node: the link between devices of one node.
        inter_node: the link between nodes.
        name: a label for reports.
        action_overhead_s: the runtime's fixed cost per compute action (F, B, W, STEP) on these
            devices (Python dispatch, buffer bookkeeping), added by the cost model.
        shared_speed: contention between ranks of one node that share cores and memory
            bandwidth (CPU ranks on one machine): entry ``n - 1`` is each rank's speed when ``n``
            of the node's ranks compute at once (``(1.0, 0.86)``: two at once run at 0.86 each).
            Past the last entry the node's throughput stays at its last value. Empty: no
            contention (separate GPUs).
        collective: the all-reduce between ranks of one node as measured by the probe, as the step
            of a ring: ``r`` ranks all-reduce ``n`` bytes in ``2 (r - 1) · latency + 2 (r - 1) / r · n /
            bandwidth``. None: priced from ``intra_node`` (a collective library on a fast link; on
            CPU gloo an all-reduce costs several times two point-to-point messages).
        message_host: each rank's own seconds per message it sends or receives (:class:`MessageHost`,
            measured by ``pipetrain probe`` on CPU ranks); all zero by default.
    """

    devices: tuple[Device, ...]
    intra_node: Link
    inter_node: Link
    name: str = "cluster"
    action_overhead_s: float = 0.0
    shared_speed: tuple[float, ...] = ()
    collective: Link | None = None
    message_host: MessageHost = NO_MESSAGE_HOST

    def concurrency_speed(self, n_busy: int) -> float:
        """Each busy rank's speed factor when ``n_busy`` ranks of one node compute at once."""
        table = self.shared_speed
        if not table or n_busy <= 1:
            return 1.0 if not table or n_busy < 1 else table[0]
        if n_busy <= len(table):
            return table[n_busy - 1]
        return table[-1] * len(table) / n_busy

    def __post_init__(self) -> None:
        if not self.devices:
            raise UserError("the cluster has no devices; list at least one")

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def link(self, src: int, dst: int) -> Link:
        same = self.devices[src].node == self.devices[dst].node
        return self.intra_node if same else self.inter_node

    @classmethod
    def local(
        cls,
        n_ranks: int,
        *,
        kind: str = "cpu",
        memory_bytes: int = 16 * GiB,
        speed: float = 1.0,
        link: Link | None = None,
        action_overhead_s: float = 0.0,
        shared_speed: tuple[float, ...] = (),
        collective: Link | None = None,
        message_host: MessageHost = NO_MESSAGE_HOST,
    ) -> Cluster:
        """``n_ranks`` identical devices on this machine (the embedded default)."""
        if n_ranks < 1:
            raise UserError(f"a cluster needs at least one rank, got {n_ranks}")
        loopback = link or Link(latency_s=1.5e-4, bandwidth_bytes_per_s=1.5e9)
        devices = tuple(Device(kind, memory_bytes, speed) for _ in range(n_ranks))
        return cls(devices, loopback, loopback, f"local-{n_ranks}x{kind}", action_overhead_s, shared_speed, collective,
                   message_host)

    def with_ranks(self, n_ranks: int) -> Cluster:
        """The same machine with ``n_ranks`` copies of its first device (local clusters)."""
        return replace(self, devices=tuple(self.devices[0] for _ in range(n_ranks)),
                       name=f"{self.name.split('-')[0]}-{n_ranks}x{self.devices[0].kind}")

    # ---- JSON -------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        """Parse :meth:`to_json` output; malformed input raises UserError naming the problem."""
        try:
            data = json.loads(text)
            cluster = cls(
                devices=tuple(Device(str(d["kind"]), int(d["memory_bytes"]), float(d.get("speed", 1.0)),
                                     int(d.get("node", 0))) for d in data["devices"]),
                intra_node=_link(data["intra_node"]),
                inter_node=_link(data["inter_node"]),
                name=str(data.get("name", "cluster")),
                action_overhead_s=float(data.get("action_overhead_s", 0.0)),
                shared_speed=tuple(float(x) for x in data.get("shared_speed", ())),
                collective=_link(data["collective"]) if data.get("collective") is not None else None,
                message_host=MessageHost(**{str(k): float(v) for k, v in data.get("message_host", {}).items()}),
            )
            _check_cluster(cluster)
            return cluster
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
            raise UserError(f"malformed cluster JSON ({e!r}); re-create it with `pipetrain probe`") from None

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Cluster:
        try:
            return cls.from_json(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"no cluster file at {path}; create one with `pipetrain probe`") from None
        except UserError as e:
            raise UserError(f"{path}: {e}") from None

    @classmethod
    def homogeneous(
        cls, model: str, n_nodes: int, per_node: int, intra: Link, inter: Link
    ) -> Cluster:
        """``n_nodes`` servers of ``per_node`` devices of one model (e.g. 2 × 4 V100)."""
        dm = device_model(model)
        devices = tuple(
            Device(dm.name, dm.memory_bytes, 1.0, node) for node in range(n_nodes) for _ in range(per_node)
        )
        return cls(devices, intra, inter, name=f"{n_nodes}x{per_node}x{dm.name}")
