"""The devices a plan runs on: this machine, estimated devices, a spec file; and their profiles.

    cluster = api.local_cluster(2)                                # this machine, 2 ranks
    cluster, assumed = api.estimated_cluster("v100", 8)           # 8 V100s with assumed links
    spec = api.load_cluster_spec("examples/clusters/2h100-2v100.yaml")
    profiles = api.cluster_profiles(graph, spec, batch_size=64)   # one Profile per device kind
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from pipetrain.api.models import profile_model
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster, Link, device_model
from pipetrain.cluster_spec import ClusterSpec, load_cluster_spec
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.planners import ModelRef
from pipetrain.profile.precision import Precision
from pipetrain.profile.table import Profile

__all__ = ["Profiles", "check_profile_of", "cluster_profiles", "each_profile", "estimated_cluster", "load_cluster",
           "local_cluster"]

Profiles = Profile | Mapping[str, Profile]
"""One profile for every device, or one per device kind (:func:`cluster_profiles`)."""


def local_cluster(n_ranks: int, path: str | Path | None = None) -> Cluster:
    """This machine with ``n_ranks`` ranks: from a `pipetrain probe` file if given, else defaults
    (loopback link, no contention, the measured CPU runtime cost per action)."""
    if path is not None:
        cluster = Cluster.load(path)
        return cluster if cluster.n_devices == n_ranks else cluster.with_ranks(n_ranks)
    return Cluster.local(n_ranks, action_overhead_s=CPU_ACTION_OVERHEAD_S)


# Links assumed for a cluster of estimated devices when none is given (--estimate without --cluster):
# (servers hold up to 8; intra-server link, inter-server link) per device model.
_ASSUMED_LINKS: dict[str, tuple[Link, Link, str]] = {
    "v100": (Link(10e-6, 45e9), Link(20e-6, 25e9 / 8), "NVLink 2 (45 GB/s) in a server, 25 Gb/s Ethernet across"),
    "a100": (Link(8e-6, 150e9), Link(10e-6, 200e9 / 8), "NVLink 3 (150 GB/s) in a server, 200 Gb/s across"),
    "h100": (Link(8e-6, 225e9), Link(10e-6, 400e9 / 8), "NVLink 4 (225 GB/s) in a server, 400 Gb/s across"),
    "fpga": (Link(10e-6, 12e9), Link(20e-6, 100e9 / 8), "PCIe 3 x16 (12 GB/s) in a server, 100 Gb/s across"),
}


def estimated_cluster(device: str, n_ranks: int) -> tuple[Cluster, str]:
    """``n_ranks`` devices of model ``device`` (8 per server) with assumed links, and a line saying
    what was assumed; ``"cpu"`` is this machine (:func:`local_cluster`).

    Raises:
        UserError: an unknown device model.
    """
    model = device_model(device).name
    if model == "cpu":
        return local_cluster(n_ranks), f"{n_ranks} local CPU ranks (loopback link)"
    intra, inter, described = _ASSUMED_LINKS[model]
    per_node = min(n_ranks, 8)
    n_nodes = -(-n_ranks // per_node)
    full = Cluster.homogeneous(model, n_nodes, per_node, intra, inter)
    cluster = dataclasses.replace(full, devices=full.devices[:n_ranks], name=f"{n_ranks}x{model}-assumed")
    return cluster, f"{n_ranks} × {model}, {per_node} per server, assumed links: {described}; pass --cluster for yours"


def load_cluster(path: str | Path, n_ranks: int | None = None) -> Cluster:
    """A cluster from a spec file (``.yaml``/``.yml``, :mod:`pipetrain.cluster_spec`) or a probe JSON.

    Args:
        n_ranks: for a probe JSON, that many copies of its device (as :func:`local_cluster`); for
            a spec, its first ``n_ranks`` ranks; None: every device the file lists.

    The spec's per-group profile files are not part of a Cluster: to use them, pass
    :func:`load_cluster_spec`'s result to :func:`cluster_profiles`.
    """
    return load_cluster_spec(path, n_ranks).cluster


def cluster_profiles(
    graph: LayerGraph, cluster: Cluster | ClusterSpec, batch_size: int, *, profile: Profile | None = None,
    precision: Precision = "fp32",
) -> dict[str, Profile]:
    """One Profile per device kind of ``cluster``, for ``CostModel(profiles, cluster)`` (docs/algorithms.md §4.3).

    For each kind, the first of these that exists:

    1. the kind's measured profile file (a spec group's ``profile``);
    2. ``profile``, e.g. one measured on this machine; the kinds that take it must share one device
       model, since one profile cannot describe two;
    3. an estimate for the kind's device model (:func:`~pipetrain.profile.estimate.estimate_profile`
       up to ``batch_size``), made once per device model.

    Every profile is at ``precision`` (estimated at it; a given one or a file at another is refused,
    :meth:`~pipetrain.profile.table.Profile.check_precision`).

    Args:
        cluster: a :class:`ClusterSpec` (from :func:`load_cluster_spec`), or a Cluster, whose
            kinds are estimated for their device models (the kind up to ``#``).

    Raises:
        UserError: a profile (file or ``profile``) of another model than ``graph`` or at another
            precision; ``profile`` for kinds of several device models; a kind whose device model is unknown.
    """
    spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.of(cluster)
    unmeasured = {kind: source.device_model for kind, source in spec.profiles.items() if source.path is None}
    if profile is not None:
        check_profile_of(graph, profile, "the given profile").check_precision(precision, "the given profile")
        if len(set(unmeasured.values())) > 1:
            raise UserError(f"one profile cannot describe device kinds {sorted(unmeasured)} of different device "
                            "models; give each spec group a measured `profile:` file, or pass no profile to "
                            "estimate each model")
    by_model = {model: profile or profile_model(graph, batch_size, estimate=model, precision=precision)
                for model in set(unmeasured.values())}
    profiles: dict[str, Profile] = {}
    for kind, source in spec.profiles.items():
        if source.path is None:
            profiles[kind] = by_model[source.device_model]
        else:
            loaded = check_profile_of(graph, Profile.load(source.path), str(source.path))
            profiles[kind] = loaded.check_precision(precision, str(source.path))
    return profiles


def check_profile_of(model: LayerGraph | ModelRef, profile: Profile, what: str) -> Profile:
    """``profile``, refused when its fingerprint says it was made for another model than ``model``
    (a model known only by its layer names, without a fingerprint, takes any profile)."""
    fingerprint = model.fingerprint() if isinstance(model, LayerGraph) else model.fingerprint
    if profile.fingerprint and fingerprint and profile.fingerprint != fingerprint:
        raise UserError(f"{what} is a profile of {profile.model!r} (fingerprint {profile.fingerprint}), not of this "
                        f"{model.name!r} ({fingerprint}): another model or other sizes; profile this one "
                        f"with `pipetrain profile --model {model.name}`")
    return profile


def each_profile(profile: Profiles) -> list[Profile]:
    """The profiles of ``profile`` (one, or one per device kind)."""
    return [profile] if isinstance(profile, Profile) else list(profile.values())
