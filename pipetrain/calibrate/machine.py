"""This machine as a cluster, probed once per machine, model and rank count, then reused from a cache.

    found = probed_cluster(graph, batch=32, n_ranks=2)   # ~15 s the first time, then read back
    found.cluster, found.path, found.probed_s            # probed_s None: read from the cache

``pipetrain plan`` (for local CPU ranks) and ``pipetrain demo`` both price a plan on this machine's
probed link, contention and per-action overhead (:func:`~pipetrain.calibrate.overhead.probe_local_cluster`);
both go through :func:`probed_cluster`, so they plan on the same cluster. The probe measures the
contention on the model's own work (:func:`probe_workload`), so its result is kept per model: the
cache key is the machine (:func:`machine_fingerprint`), the model's fingerprint, the rank count and
the probe's samples per rank. The cluster JSON lands in :func:`cache_dir`, one file per key.
``pipetrain probe --model`` keeps its result there too (:func:`keep_probe`; with ``--calibrate``, the
cluster fitted to runs of the model), so the next ``plan`` of that model reuses it. ``plan`` itself
calibrates a probe that is not calibrated yet (:func:`calibrate_machine`, ~20-60 s once per machine,
model and ranks; ``--no-calibrate`` or ``PIPETRAIN_CALIBRATE=0`` keep the probe alone).

A calibrated cluster's compute speed is relative to the profile it was fitted against (``compute at
0.33× the profile``): priced with another profile of the same model, measured at another moment of a
noisy machine, the fit does not hold (predictions off by +30 to +80% in ``bench_cli_flow.py``). So a
calibration keeps its profile beside its cluster file (:func:`calibration_profile_path`:
``probe.json`` → ``probe.profile.json``, in the cache too), and the commands that take the cluster
price with that profile unless ``--profile`` says otherwise. Its runs trained with one optimizer
(``probe --calibrate --optimizer``), whose steps the fit holds for: a record beside the cluster file
says which (:func:`calibration_record_path`: ``probe.json`` → ``probe.calibration.json``;
:func:`calibrated_optimizer` reads it), so a plan for another optimizer can say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipetrain.calibrate.overhead import probe_local_cluster
from pipetrain.cluster import Cluster
from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.batch_norm import batch_norms
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName
from pipetrain.profile.link import Workload
from pipetrain.profile.table import Profile

if TYPE_CHECKING:
    from pipetrain.calibrate.fit import Calibration

__all__ = ["CACHE_ENV", "CALIBRATE_ENV", "MachineProbe", "cache_dir", "cached_calibration_profile", "calibrate_machine",
           "calibrated_optimizer", "calibration_profile_path", "calibration_record_path", "calibration_wanted",
           "keep_probe", "machine_fingerprint", "probe_workload", "probed_cluster", "write_calibration_record"]

CALIBRATE_ENV = "PIPETRAIN_CALIBRATE"
"""The environment variable that, set to ``0``, stops ``plan`` from calibrating on its own
(:func:`calibration_wanted`)."""

CACHE_ENV = "PIPETRAIN_CACHE_DIR"
"""The environment variable that moves the cache (default ``$XDG_CACHE_HOME/pipetrain``, else
``~/.cache/pipetrain``)."""


@dataclass(frozen=True)
class MachineProbe:
    """What :func:`probed_cluster` found.

    Attributes:
        cluster: this machine as a cluster of the asked ranks.
        path: the cache file holding it.
        probed_s: seconds the probe took; None when the cluster was read from ``path``.
    """

    cluster: Cluster
    path: Path
    probed_s: float | None


def cache_dir() -> Path:
    """Where probed clusters are kept: ``$PIPETRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pipetrain``,
    else ``~/.cache/pipetrain``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pipetrain"


def probe_workload(graph: LayerGraph, batch: int) -> Workload:
    """The work the contention probe runs: ``graph``'s halves on a quarter of ``batch``, never fewer
    samples than its BatchNorms need (``pipetrain probe --model``, ``plan`` and the demo alike)."""
    return graph, max(batch_norms(graph).smallest_microbatch, batch // 4)


def machine_fingerprint() -> dict[str, str]:
    """What makes a probe of this machine stale when it changes: host name, CPU model and count,
    torch version and its threads."""
    return {"host": platform.node(), "cpu": _cpu_model(), "cpus": str(os.cpu_count()),
            "torch": torch.__version__, "threads": str(torch.get_num_threads())}


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else the platform's processor string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def _cache_path(graph: LayerGraph, n_ranks: int, samples: int) -> Path:
    """The cache file of this machine, model, rank count and probe size: the model's name (for a
    reader) and a hash of the whole key."""
    key = {"machine": machine_fingerprint(), "model": graph.fingerprint(), "ranks": n_ranks, "samples": samples}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", graph.name)
    return cache_dir() / f"cluster-{name}-{n_ranks}r-{digest}.json"


def probed_cluster(graph: LayerGraph, batch: int, n_ranks: int, *, refresh: bool = False,
                   on_probe: Callable[[], None] | None = None) -> MachineProbe:
    """This machine as ``n_ranks`` CPU ranks, probed on ``graph``'s work (:func:`probe_workload`) or
    read from the cache (module docstring).

    Args:
        graph: the model whose work the contention is measured on.
        batch: its mini-batch; the probe runs a quarter of it per rank.
        n_ranks: ranks of the cluster.
        refresh: probe even when the cache holds a result, and replace it.
        on_probe: called just before probing (to say that it takes a while); not on a cache hit.

    A cache file that cannot be read (corrupt, from another version) is probed again and replaced.
    """
    workload = probe_workload(graph, batch)
    path = _cache_path(graph, n_ranks, workload[1])
    if not refresh and path.exists():
        try:
            return MachineProbe(Cluster.load(path), path, None)
        except UserError:
            pass  # unreadable: probe again and replace it
    if on_probe is not None:
        on_probe()
    start = time.perf_counter()
    cluster = probe_local_cluster(n_ranks, model=workload)
    probed_s = time.perf_counter() - start
    write_atomic(path, cluster.to_json())
    _forget_calibration(path)  # an earlier calibration's: not for this probe
    return MachineProbe(cluster, path, probed_s)


def calibration_wanted() -> bool:
    """Whether ``plan`` for this machine may calibrate on its own (:func:`calibrate_machine`): unless the
    environment says ``PIPETRAIN_CALIBRATE=0`` (scripts and CI that want the quick probe alone)."""
    return os.environ.get(CALIBRATE_ENV, "1").strip().lower() not in ("0", "no", "off", "false")


def calibrate_machine(graph: LayerGraph, batch: int, found: MachineProbe, profile: Profile,
                      optimizer: OptimizerName) -> tuple[MachineProbe, Calibration]:
    """``found``, this machine's probe for ``graph``, calibrated on short runs of ``graph`` training with
    ``optimizer`` (:func:`~pipetrain.calibrate.fit.calibrate_cluster`, fitted against ``profile``) and
    kept in its place with that profile (:func:`keep_probe`), where the next :func:`probed_cluster`
    reads it back; its ``probed_s``, the seconds the calibration took; and the calibration (its terms
    and runs, :meth:`~pipetrain.calibrate.fit.Calibration.describe`).

    Raises:
        UserError: the model cannot run the calibration's runs (fewer layers than ranks, or a batch
            too small to give every rank of the data-parallel run a micro-batch).
    """
    from pipetrain.calibrate.fit import calibrate_cluster

    start = time.perf_counter()
    calibration = calibrate_cluster(graph, profile, found.cluster, batch, optimizer=optimizer)
    cluster = calibration.apply(found.cluster)
    path = keep_probe(graph, batch, cluster, profile, optimizer)
    return MachineProbe(cluster, path, time.perf_counter() - start), calibration


def keep_probe(graph: LayerGraph, batch: int, cluster: Cluster, calibrated_on: Profile | None = None,
               optimizer: OptimizerName = "sgd") -> Path:
    """Keep ``cluster``, a probe of this machine on ``graph``'s work (:func:`probe_workload` of
    ``batch``), where :func:`probed_cluster` finds it for its rank count; returns the cache file.
    ``calibrated_on``: the profile a calibrated cluster was fitted against, kept beside it
    (:func:`calibration_profile_path`) with the ``optimizer`` its runs trained with
    (:func:`write_calibration_record`); None removes an earlier calibration's."""
    path = _cache_path(graph, cluster.n_devices, probe_workload(graph, batch)[1])
    write_atomic(path, cluster.to_json())
    if calibrated_on is not None:
        write_atomic(calibration_profile_path(path), calibrated_on.to_json())
        write_calibration_record(path, optimizer)
    else:
        _forget_calibration(path)
    return path


def _forget_calibration(cluster_file: Path) -> None:
    """Remove what an earlier calibration kept beside ``cluster_file``: its profile and its record."""
    for companion in (calibration_profile_path(cluster_file), calibration_record_path(cluster_file)):
        companion.unlink(missing_ok=True)


def calibration_record_path(cluster_file: Path) -> Path:
    """Where the record of a calibrated cluster's runs lies: ``probe.json`` → ``probe.calibration.json``."""
    return cluster_file.with_name(f"{cluster_file.stem}.calibration.json")


def write_calibration_record(cluster_file: Path, optimizer: OptimizerName) -> Path:
    """Record beside ``cluster_file`` that its calibration runs trained with ``optimizer``; returns the record."""
    record = calibration_record_path(cluster_file)
    write_atomic(record, json.dumps({"optimizer": optimizer}, indent=1))
    return record


def calibrated_optimizer(cluster_file: Path) -> str | None:
    """The optimizer the calibration of ``cluster_file`` trained with; None where it is not calibrated
    (no profile beside it). A calibration without a readable record is taken as made before records
    were kept, when its runs trained with ``sgd``."""
    if not calibration_profile_path(cluster_file).exists():
        return None
    try:
        return str(json.loads(calibration_record_path(cluster_file).read_text())["optimizer"])
    except (OSError, ValueError, KeyError, TypeError):
        return "sgd"


def cached_calibration_profile(graph: LayerGraph, batch: int, n_ranks: int) -> Path | None:
    """The profile a calibration of this machine on ``graph`` (``pipetrain probe --model --calibrate``,
    kept by :func:`keep_probe`) was fitted against, where :func:`probed_cluster` would read that
    calibrated cluster; None without one."""
    companion = calibration_profile_path(_cache_path(graph, n_ranks, probe_workload(graph, batch)[1]))
    return companion if companion.exists() else None


def calibration_profile_path(cluster_file: Path) -> Path:
    """Where the profile a calibrated cluster was fitted against lies: beside ``cluster_file``,
    ``probe.json`` → ``probe.profile.json`` (module docstring)."""
    return cluster_file.with_name(f"{cluster_file.stem}.profile.json")
