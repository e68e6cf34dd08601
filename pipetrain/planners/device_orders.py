"""Device orders for heterogeneous pipelines: which devices run the stages, in which order.

docs/algorithms.md §4.3: the heterogeneous balanced partition depends on the order of the devices along the
pipeline, and identical devices are interchangeable, so orders are enumerated over device *types*
(same kind, memory and speed), not devices. For ``S`` stages on a cluster with ``c_t`` devices of
type ``t``, the candidates are every sub-multiset ``{k_t <= c_t, Σ k_t = S}`` (types with the most
fast devices first) and, for each, its ``S! / Π k_t!`` distinct orders, fastest types first::

    2 × h100 + 2 × v100, S = 4:  hhvv hvhv hvvh vhhv vhvh vvhh
                         S = 2:  hh | hv vh | vv

A budget ``max_orders`` per ``S`` bounds the count; a multiset whose orders no longer fit gets
only its speed-sorted order (fastest first). Each order is then placed on concrete devices: a stage
takes a free device of its type on the previous stage's node when there is one (fast intra-node
links), else the lowest-numbered.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel

__all__ = ["DeviceType", "Placement", "device_types", "placed_cluster", "placements"]


@dataclass(frozen=True)
class DeviceType:
    """Interchangeable devices.

    Attributes:
        label: the kind, numbered (``v100#2``) when several types share a kind.
        devices: their indices in the cluster, ascending.
        model_s: forward + backward seconds of the whole model on the batch on one of them (the
            speed order: fastest first).
    """

    label: str
    devices: tuple[int, ...]
    model_s: float


@dataclass(frozen=True)
class Placement:
    """The device of each stage, in pipeline order.

    Attributes:
        devices: each stage's device, as an index into the explored cluster.
        kinds: each stage's device type label.
    """

    devices: tuple[int, ...]
    kinds: tuple[str, ...]


def device_types(cost: CostModel, layer_names: Sequence[str], batch_size: int) -> list[DeviceType]:
    """The cluster's device types, fastest first (ties: the lower first device)."""
    groups: dict[tuple[str, int, float], list[int]] = {}
    for i, d in enumerate(cost.cluster.devices):
        groups.setdefault((d.kind, d.memory_bytes, d.speed), []).append(i)
    layers = tuple(layer_names)
    kinds = [key[0] for key in groups]
    types = []
    for n, ((kind, _, _), ids) in enumerate(groups.items()):
        label = kind if kinds.count(kind) == 1 else f"{kind}#{kinds[:n + 1].count(kind)}"
        seconds = cost.forward_s(layers, batch_size, ids[0]) + cost.backward_s(layers, batch_size, ids[0])
        types.append(DeviceType(label, tuple(ids), seconds))
    return sorted(types, key=lambda t: (t.model_s, t.devices[0]))


def placements(cluster: Cluster, types: Sequence[DeviceType], n_stages: int, max_orders: int) -> list[Placement]:
    """Up to ``max_orders`` device orders for ``n_stages`` stages (see the module docstring).

    Args:
        cluster: the devices (for their nodes).
        types: :func:`device_types`, fastest first.
        n_stages: ``S``, at most the number of devices.
        max_orders: the budget; at least one order is always returned.
    """
    orders: list[tuple[int, ...]] = []
    for ks in _multisets([len(t.devices) for t in types], n_stages):
        n_orders = math.factorial(n_stages) // math.prod(math.factorial(k) for k in ks)
        if len(orders) + n_orders <= max_orders:
            orders += _orders(ks)
        elif len(orders) < max_orders or not orders:
            orders.append(next(_orders(ks)))
        else:
            break
    return [_place(cluster, types, order) for order in orders]


def placed_cluster(cluster: Cluster, devices: Sequence[int]) -> tuple[Cluster, tuple[int, ...]]:
    """The cluster a plan on ``devices`` (one per stage) runs on, and each stage's rank in it.

    With every device used, the cluster itself and ``devices`` as ranks; otherwise the sub-cluster
    of the used devices in their original order, since a plan's ranks must be ``0..S-1``.
    """
    used = sorted(devices)
    if len(used) == cluster.n_devices:
        return cluster, tuple(devices)
    sub = replace(cluster, devices=tuple(cluster.devices[i] for i in used),
                  name=f"{cluster.name}[{','.join(map(str, used))}]")
    return sub, tuple(used.index(d) for d in devices)


def _multisets(available: Sequence[int], total: int) -> Iterator[tuple[int, ...]]:
    """Vectors ``k`` with ``0 <= k[t] <= available[t]`` summing to ``total``, most of type 0 first."""
    if not available:
        if total == 0:
            yield ()
        return
    for k in range(min(available[0], total), -1, -1):
        if total - k <= sum(available[1:]):
            for tail in _multisets(available[1:], total - k):
                yield (k, *tail)


def _orders(ks: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The distinct sequences with ``ks[t]`` copies of type ``t``, in lexicographic order."""
    if not any(ks):
        yield ()
        return
    for t, k in enumerate(ks):
        if k:
            for tail in _orders((*ks[:t], k - 1, *ks[t + 1:])):
                yield (t, *tail)


def _place(cluster: Cluster, types: Sequence[DeviceType], order: Sequence[int]) -> Placement:
    """Concrete devices for a type order: stay on the previous stage's node where possible."""
    free = {t: list(types[t].devices) for t in set(order)}
    devices: list[int] = []
    for t in order:
        node = cluster.devices[devices[-1]].node if devices else None
        pick = next((d for d in free[t] if cluster.devices[d].node == node), free[t][0])
        free[t].remove(pick)
        devices.append(pick)
    return Placement(tuple(devices), tuple(types[t].label for t in order))
