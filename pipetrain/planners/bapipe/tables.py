"""BaPipe's per-layer arrays for the heterogeneity-aware DP, and the error when nothing fits.

Built once per exploration from one CostModel (docs/algorithms.md §4.2–4.3, pipetrain's reconstruction);
:mod:`pipetrain.planners.bapipe.explore` scores every (method, stage count, micro-batch count,
device order) with :meth:`LayerTables.partition`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.memory import OptimizerName, parameter_copies
from pipetrain.plan.methods import METHODS, Method
from pipetrain.planners.device_orders import DeviceType, Placement, placements
from pipetrain.planners.partition.hetero import StageMemoryLimits, hetero_partition

__all__ = ["LayerTables", "no_fit_error"]

_MIB = 2**20


class LayerTables:
    """Per-layer arrays for the DP, cached by micro-batch size and device.

    Args:
        cost: profiles and cluster.
        layer_names: the layers ``L``, in order.
        batch_size: samples per mini-batch ``B``.
        optimizer: whose state counts per parameter byte (:func:`~pipetrain.plan.memory.parameter_copies`).
    """

    def __init__(self, cost: CostModel, layer_names: Sequence[str], batch_size: int,
                 optimizer: OptimizerName = "sgd") -> None:
        self.cost, self.names, self.batch = cost, tuple(layer_names), batch_size
        copies = parameter_copies(optimizer)
        self.state_bytes = np.array([copies * cost.parameter_bytes((n,)) for n in self.names], dtype=float)
        self.saved_per_sample = np.array([cost.saved_bytes((n,), 1) for n in self.names], dtype=float)
        self.layer_s = lru_cache(maxsize=None)(self._layer_s)
        self.cut_s = lru_cache(maxsize=None)(self._cut_s)

    def _layer_s(self, b: int, device: int) -> np.ndarray:
        """``[L]`` forward + backward seconds of each layer on ``b`` samples, without the per-action
        overhead (paid once per stage, not per layer)."""
        return np.array([self.cost.layer_work_s(n, b, device) for n in self.names])

    def _cut_s(self, b: int, src: int, dst: int) -> np.ndarray:
        """``[2, L-1]`` seconds to send the activation of ``b`` samples over each cut (row 0) and its
        gradient back (row 1)."""
        out = [self.cost.output_bytes((n,), b) for n in self.names[:-1]]
        return np.array([[self.cost.transfer_s(x, src, dst) for x in out],
                         [self.cost.transfer_s(x, dst, src) for x in out]])

    def memory(self, method: Method, placement: Placement, sizes: tuple[int, ...]) -> StageMemoryLimits:
        """Per position: device memory and samples in flight (a fill-drain method, GPipe, all ``B``;
        else 1F1B's first ``min(m, S - k)`` micro-batches, the largest ones as :func:`equal_sizes` puts
        them first)."""
        n = len(placement.devices)
        fill_drain = METHODS[method].fill_drain
        in_flight = [self.batch if fill_drain else sum(sizes[:min(len(sizes), n - k)]) for k in range(n)]
        limits = [self.cost.cluster.devices[d].memory_bytes for d in placement.devices]
        return StageMemoryLimits(np.array(limits, dtype=float), self.state_bytes, self.saved_per_sample,
                                 np.array(in_flight, dtype=float))

    def partition(
        self, method: Method, placement: Placement, sizes: tuple[int, ...], overlap: bool
    ) -> tuple[float, tuple[int, ...]] | None:
        """The §4.3 DP cut and its analytic ``T_iter`` (§4.2; ``overlap``: transfers beside compute);
        None when nothing fits memory."""
        b, d = max(sizes), placement.devices
        costs = np.stack([self.layer_s(b, dev) for dev in d])
        comm = None
        if len(d) > 1:
            both = np.stack([self.cut_s(b, d[k - 1], d[k]) for k in range(1, len(d))])  # [S-1, 2, L-1]
            # The stage overhead c is left out of the costs, and max(x + c, y) = max(x, y - c) + c.
            comm = both.max(axis=1) - 2 * self.cost.action_overhead_s if overlap else both.sum(axis=1)
        found = hetero_partition(costs, comm, self.memory(method, placement, sizes), overlap=overlap)
        if found is None:
            return None
        stage_s = found.bottleneck_s + 2 * self.cost.action_overhead_s
        return (len(sizes) + len(d) - 1) * stage_s, found.counts


def no_fit_error(
    tables: LayerTables, types: Sequence[DeviceType], n_stages: int, batch_size: int, max_orders: int
) -> UserError:
    """The error when nothing fits: the most frugal option (1F1B, ``n_stages`` stages, one-sample
    micro-batches) and how much of a device's memory it still needs, from the min–max DP over each
    layer's share ``(state + in_flight · saved) / limit`` of the device at each position."""
    sizes = (1,) * batch_size
    options = []
    for placement in placements(tables.cost.cluster, types, n_stages, max_orders):
        memory = tables.memory(Method.ONE_F_ONE_B, placement, sizes)
        share = (tables.state_bytes[None, :] + memory.in_flight[:, None] * tables.saved_per_sample[None, :]) \
            / memory.limit_bytes[:, None]  # [S, L]
        found = hetero_partition(share)
        assert found is not None  # no memory limit: every cut is allowed
        bounds = (0, *itertools.accumulate(found.counts))
        per_stage = [share[k, a:b].sum() for k, (a, b) in enumerate(itertools.pairwise(bounds))]
        k = int(np.argmax(per_stage))
        options.append((found.bottleneck_s, k, int(memory.limit_bytes[k]), placement))
    fraction, k, limit, placement = min(options, key=lambda o: o[0])
    return UserError(
        f"no plan fits the devices' memory: even the most frugal one (1f1b, {n_stages} stages on "
        f"{'/'.join(placement.kinds)}, micro-batches of 1 sample) needs {fraction:.1%} of stage {k}'s "
        f"{placement.kinds[k]} ({fraction * limit / _MIB:.1f} of {limit / _MIB:.1f} MiB); use a smaller "
        f"batch (now {batch_size}), more devices or devices with more memory"
    )
