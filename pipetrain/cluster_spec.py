"""Cluster spec files: device groups and links by hierarchy level, in YAML (docs/architecture.md §2).

    spec = load_cluster_spec("examples/clusters/2h100-2v100.yaml")
    spec.cluster.n_devices                  # 4: ranks 0-1 are H100s (node 0), ranks 2-3 V100s (node 1)
    spec.profiles["v100"]                   # ProfileSource(device_model='v100', path=None): estimate it

A spec lists *groups* of identical devices, in rank order, and the two links of a two-level
topology (PipeDream's hierarchy, docs/algorithms.md §3.3). Groups of different device models make the
heterogeneous clusters that BaPipe explores (docs/algorithms.md §4.3), each kind with its own Profile::

    name: 2h100-2v100              # optional label; default: the file's name without its suffix
    groups:                        # ranks are numbered group by group, in this order
      - device: h100               # a device model: cpu, v100, a100, h100, fpga (cluster.DEVICE_MODELS)
        count: 2                   # devices in the group
        per_node: 2                # devices per server (default: the whole group in one server)
        memory_gib: 80             # optional; default: the device model's memory
        speed: 1.0                 # optional; throughput relative to the group's profile (default 1)
        profile: h100-gpt.json     # optional: a measured profile (path relative to this file);
                                   # without it the profile is estimated for `device`
      - device: v100
        name: pcie                 # optional label: these devices' kind is "v100#pcie", not "v100"
        count: 2
    links:                         # latency_us or latency_s; bandwidth_gb_per_s or bandwidth_gbit_per_s
      intra_node: {latency_us: 5, bandwidth_gb_per_s: 150}     # NVLink
      inter_node: {latency_us: 20, bandwidth_gbit_per_s: 25}   # 25 Gb/s Ethernet
    action_overhead_us: 0          # optional: the runtime's fixed cost per compute action (F, B, W, STEP)
    message_host:                  # optional: each rank's own work per message (cluster.MessageHost),
      send_us: 30                  # as `pipetrain probe` measures it: fixed microseconds to post a send
      recv_us: 20                  # ... to take a receive
      send_ns_per_byte: 0.3        # ... and nanoseconds per byte on each side (copies) (each default 0)
      recv_ns_per_byte: 0

Rules:

- **Nodes.** A group fills ``count / per_node`` servers of its own, numbered after the previous
  group's; devices of different groups never share a node, and ``per_node`` must divide ``count``.
- **Units.** A link gives exactly one of ``latency_us`` / ``latency_s`` and exactly one of
  ``bandwidth_gb_per_s`` (10⁹ bytes/s) / ``bandwidth_gbit_per_s`` (10⁹ bits/s). ``inter_node``
  may be left out only when the whole cluster is one node.
- **Kinds.** A group's devices have kind ``device``, or ``device#name`` when the group is named
  (``cluster.device_model`` reads a kind's model from the part before ``#``). Devices of one kind
  are interchangeable: groups of the same kind must agree on memory, speed and profile, so two
  differing V100 groups need a ``name`` on one of them to stay apart.
- **Checks.** A missing or unknown key (a typo), a key given twice, a wrong type or a bad value
  raises UserError naming the field by its path (``groups[1].count``) and what it expects.

A probe JSON (``pipetrain probe``) loads through the same :func:`load_cluster_spec`, by suffix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from pipetrain.cluster import DEVICE_MODELS, MAX_DEVICES, Cluster, Device, DeviceModel, GiB, Link, MessageHost
from pipetrain.errors import UserError

__all__ = ["ClusterSpec", "ProfileSource", "load_cluster_spec", "parse_cluster_spec"]

# Expected values, quoted in error messages; a key's presence here is what makes it known.
_TOP_KEYS = {
    "name": "a label (text)",
    "groups": "a non-empty list of device groups",
    "links": "a mapping with intra_node and (for several nodes) inter_node",
    "action_overhead_us": "microseconds per compute action (a number >= 0)",
    "message_host": "a mapping with send_us, recv_us, send_ns_per_byte, recv_ns_per_byte (each optional)",
}
_MESSAGE_HOST_KEYS = {  # each: (the MessageHost field, seconds per unit)
    "send_us": ("send_s", 1e-6),
    "recv_us": ("recv_s", 1e-6),
    "send_ns_per_byte": ("send_per_byte_s", 1e-9),
    "recv_ns_per_byte": ("recv_per_byte_s", 1e-9),
}
_GROUP_KEYS = {
    "device": f"a device model ({', '.join(DEVICE_MODELS)})",
    "name": "a label of letters, digits, '_', '.' or '-'",
    "count": "the number of devices (a whole number >= 1)",
    "per_node": "devices per server (a whole number >= 1 that divides count)",
    "memory_gib": "device memory in GiB (a number > 0)",
    "speed": "throughput relative to the profile (a number > 0)",
    "profile": "the path of a measured profile JSON",
}
_LINK_KEYS = {
    "latency_us": "microseconds (a number >= 0)",
    "latency_s": "seconds (a number >= 0)",
    "bandwidth_gb_per_s": "10^9 bytes per second (a number > 0)",
    "bandwidth_gbit_per_s": "10^9 bits per second (a number > 0)",
}
_LINKS_KEYS = {
    "intra_node": "a link {latency_us: ..., bandwidth_gb_per_s: ...}",
    "inter_node": "a link {latency_us: ..., bandwidth_gbit_per_s: ...}",
}
_UNITS_PER_S = {"latency_us": 1e6, "latency_s": 1.0}  # a latency in seconds is its value / this
_BYTES_PER_S = {"bandwidth_gb_per_s": 1e9, "bandwidth_gbit_per_s": 1e9 / 8}  # a bandwidth in B/s: value * this
_LABEL = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ProfileSource:
    """Where one device kind's Profile comes from.

    Attributes:
        device_model: the ``DEVICE_MODELS`` name to estimate the profile for when ``path`` is None.
        path: a profile JSON measured on this kind of device (``pipetrain profile``), or None.
    """

    device_model: str
    path: Path | None = None


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster and, for each of its device kinds, where the kind's Profile comes from.

    Attributes:
        cluster: the devices in rank order and the links.
        profiles: one entry per distinct ``Device.kind`` of ``cluster``.
    """

    cluster: Cluster
    profiles: Mapping[str, ProfileSource]

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterSpec:
        """The spec of a cluster built in code or probed: each kind estimated for its model (up to ``#``)."""
        return cls(cluster, {d.kind: ProfileSource(d.kind.partition("#")[0].lower()) for d in cluster.devices})

    def first_ranks(self, n_ranks: int) -> ClusterSpec:
        """The spec cut to its first ``n_ranks`` ranks (all of them: unchanged)."""
        devices = self.cluster.devices
        if not 1 <= n_ranks <= len(devices):
            raise UserError(f"{n_ranks} ranks asked of cluster {self.cluster.name!r}, which has {len(devices)} "
                            f"devices; use 1 to {len(devices)} ranks or add devices to its spec")
        if n_ranks == len(devices):
            return self
        kept = devices[:n_ranks]
        kinds = {d.kind for d in kept}
        cluster = replace(self.cluster, devices=kept, name=f"{self.cluster.name}-first{n_ranks}")
        return ClusterSpec(cluster, {k: s for k, s in self.profiles.items() if k in kinds})


@dataclass(frozen=True)
class _Group:
    """One parsed group: ``count`` devices of one kind filling ``count / per_node`` nodes."""

    kind: str
    model: DeviceModel
    count: int
    per_node: int
    memory_bytes: int
    speed: float
    profile: Path | None


def load_cluster_spec(path: str | Path, n_ranks: int | None = None) -> ClusterSpec:
    """A cluster spec from a YAML file (``.yaml``/``.yml``) or a probe JSON (``.json``).

    Args:
        path: the file; a spec's profile paths are relative to its folder.
        n_ranks: for a probe JSON, that many copies of its device (``Cluster.with_ranks``, as the
            local cluster); for a spec, its first ``n_ranks`` ranks; None: every device as listed.

    Raises:
        UserError: no such file, another suffix, or a spec error (prefixed with the file's path).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        cluster = Cluster.load(path)
        return ClusterSpec.of(cluster if n_ranks is None else cluster.with_ranks(n_ranks))
    if suffix not in (".yaml", ".yml"):
        raise UserError(f"cluster file {path} must end in .yaml or .yml (a cluster spec) or .json "
                        "(written by `pipetrain probe`)")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"no cluster spec at {path}; write one (examples in examples/clusters/)") from None
    try:
        spec = parse_cluster_spec(text, base_dir=path.parent, default_name=path.stem)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    return spec if n_ranks is None else spec.first_ranks(n_ranks)


def parse_cluster_spec(text: str, *, base_dir: Path = Path(), default_name: str = "cluster") -> ClusterSpec:
    """Parse a spec's YAML text (the format in the module docstring).

    Args:
        text: the YAML.
        base_dir: the folder that relative ``profile`` paths start from.
        default_name: the cluster's name when the spec gives none.

    Raises:
        UserError: invalid YAML or a bad spec; the message names the field (``groups[1].count``).
    """
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as e:
        raise UserError(f"the cluster spec is not valid YAML: {e}".replace("\n", " ")) from None
    top = _fields(data, "the spec", _TOP_KEYS, required=("groups", "links"))
    name = _text(top.get("name", default_name), "name")
    groups = _groups(top["groups"], base_dir)
    devices: list[Device] = []
    for group in groups:
        first_node = devices[-1].node + 1 if devices else 0
        devices += [Device(group.kind, group.memory_bytes, group.speed, first_node + i // group.per_node)
                    for i in range(group.count)]
    intra, inter = _links(top["links"], n_nodes=devices[-1].node + 1)
    overhead_s = _number(top.get("action_overhead_us", 0.0), "action_overhead_us", positive=False) / 1e6
    cluster = Cluster(tuple(devices), intra, inter, name=name, action_overhead_s=overhead_s,
                      message_host=_message_host(top.get("message_host", {})))
    return ClusterSpec(cluster, {g.kind: ProfileSource(g.model.name, g.profile) for g in groups})


def _message_host(value: object) -> MessageHost:
    """The ``message_host`` mapping: each key's number (>= 0) in its unit, as seconds."""
    keys = {key: "a number >= 0" for key in _MESSAGE_HOST_KEYS}
    data = _fields(value, "message_host", keys, required=())
    return MessageHost(**{field: _number(data[key], f"message_host.{key}", positive=False) * unit
                          for key, (field, unit) in _MESSAGE_HOST_KEYS.items() if key in data})


def _groups(value: object, base_dir: Path) -> list[_Group]:
    if not isinstance(value, list) or not value:
        raise UserError(f"groups must be {_TOP_KEYS['groups']}, got {value!r}")
    groups = [_group(item, f"groups[{i}]", base_dir) for i, item in enumerate(value)]
    total = sum(g.count for g in groups)
    if total > MAX_DEVICES:
        raise UserError(f"the groups hold {total} devices, more than pipetrain plans for; give at most {MAX_DEVICES}")
    _check_kinds(groups)
    return groups


def _group(value: object, where: str, base_dir: Path) -> _Group:
    data = _fields(value, where, _GROUP_KEYS, required=("device", "count"))
    device = data["device"]
    if not isinstance(device, str) or device.lower() not in DEVICE_MODELS:
        raise UserError(f"{where}.device must be {_GROUP_KEYS['device']}, got {device!r}")
    model = DEVICE_MODELS[device.lower()]
    count = _whole(data["count"], f"{where}.count")
    per_node = _whole(data.get("per_node", count), f"{where}.per_node")
    if count % per_node:
        raise UserError(f"{where}.per_node ({per_node}) must divide {where}.count ({count}): a group fills whole "
                        "servers; put a partly filled server in a group of its own")
    memory_bytes = model.memory_bytes
    if "memory_gib" in data:
        memory_bytes = int(_number(data["memory_gib"], f"{where}.memory_gib") * GiB)
    kind = model.name
    if "name" in data:
        label = data["name"]
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise UserError(f"{where}.name must be {_GROUP_KEYS['name']}, got {label!r}")
        kind = f"{model.name}#{label}"
    profile = None
    if "profile" in data:
        profile = _existing_file(data["profile"], f"{where}.profile", base_dir)
    speed = _number(data.get("speed", 1.0), f"{where}.speed")
    return _Group(kind, model, count, per_node, memory_bytes, speed, profile)


def _check_kinds(groups: list[_Group]) -> None:
    """Groups of one kind must be interchangeable (same memory, speed and profile)."""
    first: dict[str, int] = {}
    for i, group in enumerate(groups):
        j = first.setdefault(group.kind, i)
        other = groups[j]
        differ = [key for key, a, b in (("memory_gib", group.memory_bytes, other.memory_bytes),
                                        ("speed", group.speed, other.speed),
                                        ("profile", group.profile, other.profile)) if a != b]
        if differ:
            raise UserError(f"groups[{i}] and groups[{j}] are both of kind {group.kind!r} but differ in "
                            f"{', '.join(differ)}; devices of one kind must be identical: give groups[{i}] a "
                            f"name (its kind becomes '{group.model.name}#<name>')")


def _links(value: object, n_nodes: int) -> tuple[Link, Link]:
    data = _fields(value, "links", _LINKS_KEYS, required=("intra_node",))
    intra = _link(data["intra_node"], "links.intra_node")
    if "inter_node" in data:
        return intra, _link(data["inter_node"], "links.inter_node")
    if n_nodes > 1:
        raise UserError(f"links.inter_node is missing: the cluster spans {n_nodes} nodes, so give "
                        f"{_LINKS_KEYS['inter_node']}")
    return intra, intra  # one node: no link ever crosses nodes


def _link(value: object, where: str) -> Link:
    data = _fields(value, where, _LINK_KEYS, required=())
    key, latency = _one_of(data, where, _UNITS_PER_S, positive=False)
    latency_s = latency / _UNITS_PER_S[key]
    key, bandwidth = _one_of(data, where, _BYTES_PER_S, positive=True)
    return Link(latency_s, bandwidth * _BYTES_PER_S[key])


def _one_of(data: Mapping[str, object], where: str, keys: Mapping[str, float], *, positive: bool) -> tuple[str, float]:
    """The one of ``keys`` that ``data`` gives (the same quantity in different units), and its value."""
    given = [key for key in keys if key in data]
    if len(given) != 1:
        raise UserError(f"{where} needs exactly one of {' or '.join(keys)}, got {'both' if given else 'neither'}")
    return given[0], _number(data[given[0]], f"{where}.{given[0]}", positive=positive)


# ---- typed field readers: each names the field's path and what it expects ----------------------

def _fields(
    value: object, where: str, keys: Mapping[str, str], required: tuple[str, ...]
) -> dict[str, object]:
    """``value`` as a mapping, with no unknown key and every ``required`` one."""
    if not isinstance(value, dict):
        raise UserError(f"{where} must be a mapping with keys {', '.join(keys)}, got {value!r}")
    prefix = "" if where == "the spec" else f"{where}."
    for key in value:
        if key not in keys:
            raise UserError(f"{prefix}{key} is not a known key; {where} takes {', '.join(keys)}")
    for key in required:
        if key not in value:
            raise UserError(f"{prefix}{key} is missing: give {keys[key]}")
    return {str(key): item for key, item in value.items()}


def _number(value: object, where: str, *, positive: bool = True) -> float:
    """A finite number > 0 (``positive``) or >= 0; YAML's booleans are not numbers."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value > 0 or (value == 0 and not positive):
            return float(value)
    raise UserError(f"{where} must be a number {'> 0' if positive else '>= 0'}, got {value!r}")


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where} must be a whole number >= 1, got {value!r}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"{where} must be non-empty text, got {value!r}")
    return value


def _existing_file(value: object, where: str, base_dir: Path) -> Path:
    path = base_dir / _text(value, where)
    if not path.is_file():
        raise UserError(f"{where}: no file at {path}; measure one with `pipetrain profile --out {path}`, "
                        "or leave profile out to estimate it for the group's device")
    return path


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (YAML would keep the last)."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """The mapping, refused if one of its own keys comes twice (merged ``<<: *anchor`` keys may be overridden)."""
    seen: set[object] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise UserError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one mapping; "
                            "keep one")
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
