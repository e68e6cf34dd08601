"""Link probe: measure this machine's rank-to-rank link and how much co-located ranks slow down.

    cluster = probe_cluster(n_ranks=2)          # median of 3 probes, as a Cluster
    probe = probe_link()                         # one probe's raw numbers

Two local processes (``torch.multiprocessing.spawn``, one intra-op thread each) join a process
group over TCP on 127.0.0.1 and

1. ping-pong a ``uint8`` tensor of each size (64 B to 16 MiB by default): the one-way time is half
   the round trip, the median of ``repeats`` after a short warm-up; then :func:`fit_link` fits
   ``time_s = latency_s + bytes / bandwidth_bytes_per_s`` (the link model of ``cluster.Link``,
   the communication cost of docs/algorithms.md §2.2);
2. time a compute loop on each rank alone in turn, then on both ranks at once. ``contention_speed``
   is the ratio of the two speeds, ``t_alone / t_together``: ranks sharing a machine share its
   caches and memory bandwidth, so each runs slower while both compute (``Cluster.shared_speed``,
   which the simulator applies only while both are busy). How much depends on the work: a layer
   that streams its weights from memory suffers more than one that stays in cache. The loop is
   therefore the model's own when one is given (``model=(graph, micro)``: rank 0 runs the forward
   and backward of the first half of its layers, rank 1 of the second half, on ``micro`` samples,
   which is what a 2-stage pipeline of it runs), else a generic block (one ``mlp`` zoo block,
   1024 → 4096 → 1024, on 32 samples). Each phase runs three times and the median ratio over
   rounds and ranks is kept, because shared machines are noisy;
3. all-reduce a ``float32`` tensor of each size, as the runtime sums a replicated stage's gradients
   (one flat tensor, copied out after): on CPU gloo an all-reduce costs several times a message
   (about 0.4 ms for 64 bytes where a message takes 0.08 ms here). The same fit, halved in latency
   (a ring of two ranks takes two steps), gives ``Cluster.collective``, which prices the
   all-reduce of replicated stages (``CostModel.allreduce_s``).

4. time the host work of a message on each side, as the runtime's transport does it (SEND: ``isend``
   of a contiguous tensor, returning at once; RECV: completing a pre-posted ``irecv`` whose message
   has arrived, and posting the channel's next one), for 1 KiB, 64 KiB and 1 MiB: the median of the
   repeats per size, then :func:`fit_message_host` fits ``fixed + bytes · per_byte`` per side
   (``Cluster.message_host``, :class:`~pipetrain.cluster.MessageHost`). The rank is busy for these
   seconds whatever the link does; the ping-pong of step 1 measures them too, but as part of the
   one-way time, where they overlap nothing. Here they were 20-40 µs a message on each side.

Given the link (and all-reduce and message host costs) of an earlier probe (``link=``, ``collective=``,
``message_host=``), steps 1, 3 and 4 are skipped and only the contention is measured: how a benchmark
probes each model's contention without re-measuring the same link.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn as _untyped_spawn

from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, NO_MESSAGE_HOST, Cluster, Link, MessageHost
from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.dataflow import chain_stage
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo.mlp import MLPBlock
from pipetrain.profile.inputs import sample_input

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SIZES_BYTES",
    "LinkProbe",
    "Workload",
    "fit_collective",
    "fit_error",
    "fit_link",
    "fit_message_host",
    "probe_cluster",
    "probe_link",
    "probe_links",
]

DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(64 * 4**k for k in range(10))  # 64 B … 16 MiB
_spawn: Callable[..., object] = _untyped_spawn  # torch leaves it unannotated
Workload = tuple[LayerGraph, int]
"""A model and a micro-batch size: the contention probe's work (:func:`probe_link`)."""
_WARMUP = 3
_HOST_SIZES_BYTES = (1 << 10, 1 << 16, 1 << 20)
"""Message sizes whose host seconds are timed (step 4 of the module docstring)."""
_CONTENTION_ROUNDS = 3
_COMPUTE_STEPS = 8


@dataclass(frozen=True)
class LinkProbe:
    """What :func:`probe_link` measured.

    Attributes:
        link: the fitted link.
        points: ``(bytes, one-way seconds)`` per probed size, the median of the repeats (empty when
            the link was given, not measured).
        max_relative_error: the fit's largest ``|predicted - measured| / measured`` over ``points``
            (0 when the link was given).
        contention_speed: a rank's compute speed with two ranks busy, relative to one alone.
        backend: the ``torch.distributed`` backend probed.
        collective: the all-reduce's ring step fitted to ``collective_points`` (:func:`fit_collective`),
            or the one given with the link (None if none was).
        collective_points: ``(bytes, seconds)`` of an all-reduce over the two ranks per probed size
            (empty when the link was given).
        message_host: the ranks' host seconds per message, fitted to ``host_points``
            (:func:`fit_message_host`), or the one given with the link (all zero if none was).
        host_points: ``(bytes, send seconds, receive seconds)`` per size (empty when the link was given).
    """

    link: Link
    points: tuple[tuple[int, float], ...]
    max_relative_error: float
    contention_speed: float
    backend: str
    collective: Link | None
    collective_points: tuple[tuple[int, float], ...]
    message_host: MessageHost
    host_points: tuple[tuple[int, float, float], ...]


def fit_link(points: Sequence[tuple[int, float]]) -> Link:
    """Fit ``seconds = latency_s + bytes / bandwidth_bytes_per_s`` to ``(bytes, seconds)`` points.

    Least squares on *relative* residuals ``(latency + bytes·c) / seconds - 1`` (``c`` the inverse
    bandwidth), so that 64-byte messages, which only the latency explains, weigh as much as 16 MiB
    ones. A negative latency (noise) is clamped to 0 and the inverse bandwidth refitted alone.

    Raises:
        UserError: fewer than two distinct sizes, a non-positive time, or times that do not grow
            with size.
    """
    n = np.array([float(p[0]) for p in points])
    t = np.array([float(p[1]) for p in points])
    if len(np.unique(n)) < 2 or (t <= 0).any():
        raise UserError("fit_link needs positive times for at least two different message sizes")
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (latency_s, inverse_bw), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if latency_s < 0:
        latency_s = 0.0
        inverse_bw = float(np.dot(n / t, np.ones_like(t)) / np.dot(n / t, n / t))
    if inverse_bw <= 0:
        raise UserError("link times do not grow with message size; probe larger messages")
    return Link(latency_s=float(latency_s), bandwidth_bytes_per_s=float(1.0 / inverse_bw))


def fit_collective(points: Sequence[tuple[int, float]]) -> Link:
    """The ring step of an all-reduce over two ranks from its ``(bytes, seconds)`` points.

    A ring of ``r`` ranks all-reduces ``n`` bytes in ``2 (r - 1) · latency + 2 (r - 1) / r · n / bandwidth``
    (``CostModel.allreduce_s``); at ``r = 2`` that is ``2 · latency + n / bandwidth``, so the step's
    latency is half the fitted intercept and its bandwidth the fitted one.
    """
    fitted = fit_link(points)
    return Link(fitted.latency_s / 2, fitted.bandwidth_bytes_per_s)


def fit_message_host(points: Sequence[tuple[int, float, float]]) -> MessageHost:
    """``fixed + bytes · per_byte`` per side from ``(bytes, send seconds, receive seconds)`` points:
    least squares, a negative intercept or slope (noise) clamped to 0 and the other refitted alone.

    Raises:
        UserError: fewer than two distinct sizes.
    """
    n = np.array([float(p[0]) for p in points])
    if len(np.unique(n)) < 2:
        raise UserError("fit_message_host needs times for at least two different message sizes")

    def line(t: np.ndarray) -> tuple[float, float]:
        per_byte, fixed = np.polyfit(n, t, 1)
        if per_byte < 0:
            return float(max(0.0, t.mean())), 0.0
        if fixed < 0:
            return 0.0, float(max(0.0, np.dot(n, t) / np.dot(n, n)))
        return float(fixed), float(per_byte)

    send_s, send_per_byte_s = line(np.array([float(p[1]) for p in points]))
    recv_s, recv_per_byte_s = line(np.array([float(p[2]) for p in points]))
    return MessageHost(send_s, recv_s, send_per_byte_s, recv_per_byte_s)


def fit_error(link: Link, points: Sequence[tuple[int, float]]) -> float:
    """Largest relative error of ``link`` over ``(bytes, seconds)`` points."""
    return max(abs(link.transfer_s(n) - t) / t for n, t in points)


# ---- the spawned ranks ----------------------------------------------------------------------


def _one_way_s(rank: int, n_bytes: int, repeats: int) -> float:
    """Median one-way seconds of an ``n_bytes`` message (meaningful on rank 0).

    Each rank posts its receive before sending, as a pipeline runtime should: with gloo, a
    message that arrives before its receive is posted took about 2 ms more on the development
    machine, whatever its size.
    """
    outgoing = torch.zeros(n_bytes, dtype=torch.uint8)
    incoming = torch.empty_like(outgoing)
    peer = 1 - rank
    times = []
    for _ in range(_WARMUP + repeats):
        start = time.perf_counter()
        reply = dist.irecv(incoming, peer)
        assert reply is not None  # None only for a rank outside the group
        if rank == 0:
            dist.send(outgoing, peer)
            reply.wait()
        else:
            reply.wait()
            dist.send(outgoing, peer)
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times[_WARMUP:])


def _host_s(rank: int, n_bytes: int, repeats: int) -> tuple[float, float]:
    """Median host seconds of an ``n_bytes`` message on each side (module docstring, step 4): rank 0
    posting its send, rank 1 taking the arrived message and posting its next receive; on both ranks.

    Each message has arrived before rank 1 takes it: rank 0 waits for its send, and the barrier that
    follows travels behind it on the ranks' connection."""
    payload = torch.zeros(n_bytes, dtype=torch.uint8)
    posted = dist.irecv(torch.empty_like(payload), 0) if rank == 1 else None
    times = []
    for i in range(_WARMUP + repeats):
        dist.barrier()
        if rank == 0:
            start = time.perf_counter()
            work = dist.isend(payload.contiguous(), 1)
            times.append(time.perf_counter() - start)
            assert work is not None  # None only for a rank outside the group
            work.wait()
        dist.barrier()
        if rank == 1:
            assert posted is not None
            start = time.perf_counter()
            taken = posted
            posted = dist.irecv(torch.empty_like(payload), 0) if i + 1 < _WARMUP + repeats else None
            taken.wait()
            times.append(time.perf_counter() - start)
    mine = torch.tensor([statistics.median(times[_WARMUP:])], dtype=torch.float64)
    both = [torch.zeros(1, dtype=torch.float64) for _ in range(2)]
    dist.all_gather(both, mine)
    return float(both[0]), float(both[1])


def _allreduce_s(n_bytes: int, repeats: int) -> float:
    """Median seconds of an all-reduce of ``n_bytes`` (as ``float32``) over both ranks, copied out
    after as the runtime copies a stage's gradients back (meaningful on rank 0)."""
    flat = torch.zeros(max(1, n_bytes // 4))
    times = []
    for _ in range(_WARMUP + repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        flat.clone()
        times.append(time.perf_counter() - start)
    return statistics.median(times[_WARMUP:])


def _compute_s(block: torch.nn.Module, x: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(_COMPUTE_STEPS):
        block(x).float().sum().backward()
    return time.perf_counter() - start


def _workload(rank: int, model: Workload | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """What ``rank`` computes while contention is measured: the generic block, or its half of the
    model (the first or second half of its layers) on ``micro`` samples, with the input that half sees."""
    if model is None:
        return MLPBlock(1024, 4096, 1024, last=False), torch.randn(32, 1024)
    graph, micro = model
    half = len(graph) // 2
    indices = range(half) if rank == 0 else range(half, len(graph))
    x = sample_input(graph.input, micro, torch.device("cpu"), torch.Generator().manual_seed(graph.seed))
    if rank == 1:
        with torch.no_grad():
            x = chain_stage(graph, range(half))(x)
        x = x.requires_grad_(x.is_floating_point())
    return chain_stage(graph, indices), x


def _contention_speed(rank: int, model: Workload | None) -> float:
    """The median over rounds and both ranks of ``t_alone / t_together`` (the same on every rank)."""
    block, x = _workload(rank, model)
    _compute_s(block, x)  # warm-up
    ratios = []
    for _ in range(_CONTENTION_ROUNDS):
        alone = 1.0
        for turn in range(2):  # each rank alone in turn, the other waiting in the barrier
            dist.barrier()
            if rank == turn:
                alone = _compute_s(block, x)
        dist.barrier()
        ratios.append(alone / _compute_s(block, x))
    gathered = [torch.zeros(len(ratios), dtype=torch.float64) for _ in range(2)]
    dist.all_gather(gathered, torch.tensor(ratios, dtype=torch.float64))
    return statistics.median(float(r) for t in gathered for r in t)


def _rank_main(
    rank: int, port: int, sizes: tuple[int, ...], repeats: int, backend: str, out: str, model: Workload | None,
    rounds: int,
) -> None:
    """One rank of ``rounds`` probes, one after another in one process group (ranks start once)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    try:
        results = []
        for _ in range(rounds):
            points = [(n, _one_way_s(rank, n, repeats)) for n in sizes]  # no sizes: the link was given
            collective = [(n, _allreduce_s(n, repeats)) for n in sizes]
            host = [(n, *_host_s(rank, n, repeats)) for n in (_HOST_SIZES_BYTES if sizes else ())]
            results.append({"points": points, "collective": collective, "host": host,
                            "contention_speed": _contention_speed(rank, model)})
        if rank == 0:
            write_atomic(out, json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def probe_link(
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 20, backend: str = "gloo",
    model: Workload | None = None, link: Link | None = None, collective: Link | None = None,
    message_host: MessageHost = NO_MESSAGE_HOST,
) -> LinkProbe:
    """Measure the link between two local ranks and their compute contention: one probe of
    :func:`probe_links` (its arguments, errors and result)."""
    return probe_links(1, sizes_bytes, repeats, backend, model=model, link=link, collective=collective,
                       message_host=message_host)[0]


def probe_links(
    rounds: int, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 20, backend: str = "gloo",
    *, model: Workload | None = None, link: Link | None = None, collective: Link | None = None,
    message_host: MessageHost = NO_MESSAGE_HOST,
) -> list[LinkProbe]:
    """Measure the link between two local ranks and their compute contention, ``rounds`` times in a row.

    The ranks start once for all rounds: starting two processes that import torch costs seconds,
    more than a round's work on a loaded machine.

    Args:
        rounds: probes to take, one after another (at least 1).
        sizes_bytes: message sizes to ping-pong; at least two different ones.
        repeats: timed round trips per size (after 3 untimed ones).
        backend: ``torch.distributed`` backend (``"gloo"`` on CPU).
        model: ``(graph, micro)``: measure the contention of this model's two halves on ``micro``
            samples (what a 2-stage pipeline of it runs) instead of the generic block.
        link: the link of an earlier probe: do not ping-pong or all-reduce, only measure the
            contention (then ``sizes_bytes`` and ``repeats`` are unused).
        collective: with ``link``, the earlier probe's all-reduce, returned as it is.
        message_host: with ``link``, the earlier probe's host seconds per message, returned as they are.

    Returns:
        Per round, the fitted link, the raw points, the fit's error, the contention speed and the
        host seconds per message.

    Raises:
        UserError: fewer than two distinct positive sizes, or ``repeats < 1``.
    """
    sizes = tuple(sorted(set(sizes_bytes)))
    if model is not None and (len(model[0]) < 2 or model[1] < 1):
        raise UserError(f"the contention probe splits the model in two halves of its layers on micro-batches of "
                        f"1 or more samples; {model[0].name!r} has {len(model[0])} layers and the micro-batch "
                        f"{model[1]}: probe without the model")
    if link is None and (len(sizes) < 2 or sizes[0] < 1 or repeats < 1):
        raise UserError(
            f"probe_link needs two or more positive sizes and repeats >= 1, "
            f"got sizes {list(sizes_bytes)} and repeats {repeats}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        args = (_free_port(), sizes if link is None else (), repeats, backend, str(out), model, max(1, rounds))
        _spawn(_rank_main, args=args, nprocs=2, join=True)
        results = json.loads(out.read_text())
    return [_link_probe(result, backend, link, collective, message_host) for result in results]


def _link_probe(result: dict[str, Any], backend: str, link: Link | None, collective: Link | None,
                message_host: MessageHost) -> LinkProbe:
    """One round's raw measurements (as rank 0 wrote them) fitted: the link, all-reduce and host
    seconds per message unless given."""
    points = tuple((int(n), float(t)) for n, t in result["points"])
    collective_points = tuple((int(n), float(t)) for n, t in result["collective"])
    host_points = tuple((int(n), float(send), float(recv)) for n, send, recv in result["host"])
    fitted = fit_link(points) if link is None else link
    return LinkProbe(
        link=fitted,
        points=points,
        max_relative_error=fit_error(fitted, points) if points else 0.0,
        contention_speed=float(result["contention_speed"]),
        backend=backend,
        collective=_fit_collective_or_none(collective_points) if link is None else collective,
        collective_points=collective_points,
        message_host=fit_message_host(host_points) if link is None else message_host,
        host_points=host_points,
    )


def _fit_collective_or_none(points: Sequence[tuple[int, float]]) -> Link | None:
    """:func:`fit_collective`, or None (all-reduces then priced from the link) with a warning when the
    timed all-reduces do not grow with size: on a loaded machine a few repeats of a collective,
    which waits for both ranks, can be that noisy; one bad fit should not lose the whole probe."""
    try:
        return fit_collective(points)
    except UserError:
        log.warning("the all-reduce times did not grow with size (%s): too noisy to fit; all-reduces are "
                    "priced from the link instead (probe again on a quieter machine, or with more repeats)",
                    ", ".join(f"{n} B {t * 1e6:.0f} us" for n, t in points))
        return None


def probe_cluster(
    n_ranks: int = 2, *, probes: int = 3, action_overhead_s: float = CPU_ACTION_OVERHEAD_S,
    model: Workload | None = None, link: Link | None = None, collective: Link | None = None,
    message_host: MessageHost = NO_MESSAGE_HOST,
) -> Cluster:
    """This machine as a cluster of ``n_ranks`` CPU ranks, from the median of ``probes`` probes.

    One probe can catch a neighbour's burst on a shared machine (contention speeds from 0.43 to
    1.37 were seen in single probes here), hence the median of several.

    Args:
        n_ranks: ranks of the cluster (all on this machine).
        probes: probes to take the median of (about 3 s each on a quiet machine; the ranks start once).
        action_overhead_s: the runtime's fixed seconds per F or B action.
        model: ``(graph, micro)`` to measure contention on that model's work (:func:`probe_link`).
        link: the link of an earlier probe (e.g. ``cluster.intra_node``): kept as it is, only the
            contention is measured.
        collective: with ``link``, the earlier probe's all-reduce (``cluster.collective``), kept as it is.
        message_host: with ``link``, the earlier probe's host seconds per message (``cluster.message_host``),
            kept as they are.
    """
    results = probe_links(max(1, probes), model=model, link=link, collective=collective, message_host=message_host)
    if link is None:
        link = Link(statistics.median(r.link.latency_s for r in results),
                    statistics.median(r.link.bandwidth_bytes_per_s for r in results))
        measured = [r.collective for r in results if r.collective is not None]
        collective = Link(statistics.median(c.latency_s for c in measured),
                          statistics.median(c.bandwidth_bytes_per_s for c in measured))
        hosts = [r.message_host for r in results]
        message_host = MessageHost(*(statistics.median(getattr(h, f) for h in hosts)
                                     for f in ("send_s", "recv_s", "send_per_byte_s", "recv_per_byte_s")))
    speed = min(1.0, statistics.median(r.contention_speed for r in results))
    return Cluster.local(n_ranks, link=link, shared_speed=(1.0, speed), action_overhead_s=action_overhead_s,
                         collective=collective, message_host=message_host)
