"""The schedule generators, one per method: ``Method → generator(plan) → Orders`` (docs/architecture.md §4).

A generator sees all stages at once (an order may depend on its neighbours' partitions) and returns
the plan's compute actions, F, B, W and STEP, as :data:`~pipetrain.schedule.orders.Orders`: one
program per stage under the single placement, one per rank under a looping or V placement. What
every method shares is done once, around the generator, by
:func:`~pipetrain.schedule.generators.build_schedule`: the replica split, the STEPs and weight
versions of an asynchronous method (:mod:`pipetrain.schedule.asynchronous`), the communication pass
(:mod:`pipetrain.schedule.passes`) and validation (:mod:`pipetrain.schedule.validate`,
:mod:`pipetrain.schedule.versions`). A new method is a row of
:data:`~pipetrain.plan.methods.METHODS` and a generator here; tests/unit/test_generators.py runs the
validator over every method's generator on a parameter grid, and tests/unit/test_golden_schedules.py
asks every method for a golden schedule.

    method          generator                       module (schedule family)
    gpipe, uedp     gpipe_orders                    fill_drain
    1f1b, graph     one_f_one_b_orders              one_f_one_b (chain or DAG of stages)
    pipedream, 2bw  asynchronous_orders             asynchronous (1F1B without a flush)
    local           local_orders                    local_learning
    zb1, zb2        zb1_orders, zb2_orders          zero_bubble
    interleaved     interleaved_programs            interleaved
    interleaved-zb  interleaved_zb_programs         interleaved_zb
    zbv             zbv_programs                    zbv
    dualpipev       dualpipev_programs              dualpipev
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from pipetrain.errors import UserError
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.schedule.asynchronous import asynchronous_orders
from pipetrain.schedule.dualpipev import dualpipev_programs
from pipetrain.schedule.fill_drain import gpipe_orders
from pipetrain.schedule.interleaved import interleaved_programs
from pipetrain.schedule.interleaved_zb import interleaved_zb_programs
from pipetrain.schedule.local_learning import local_orders
from pipetrain.schedule.one_f_one_b import one_f_one_b_orders
from pipetrain.schedule.orders import Orders
from pipetrain.schedule.zbv import zbv_programs
from pipetrain.schedule.zero_bubble import zb1_orders, zb2_orders

__all__ = ["GENERATORS", "Generator", "generator_for"]

Generator = Callable[[Plan], Orders]
"""A plan (an asynchronous method's: the plan of its whole run) → its programs before the replica split."""

GENERATORS: Mapping[Method, Generator] = MappingProxyType({
    Method.GPIPE: gpipe_orders,  # Huang et al. 2019
    Method.ONE_F_ONE_B: one_f_one_b_orders,  # Narayanan et al. 2021 (PipeDream-Flush)
    Method.PIPEDREAM: asynchronous_orders,  # Narayanan et al. 2019
    Method.TWO_BW: asynchronous_orders,  # Narayanan et al. 2021 (PipeDream-2BW)
    Method.UEDP: gpipe_orders,  # UMPIPE: GPipe's order, each stage's own forward and backward partitions
    Method.GRAPH: one_f_one_b_orders,  # Jeon et al. 2025 (GraphPipe): 1F1B over a DAG of stages
    Method.LOCAL: local_orders,  # Guo et al. 2024 (PPLL)
    Method.INTERLEAVED: interleaved_programs,  # Narayanan et al. 2021 §2.2
    Method.ZB1: zb1_orders,  # Qi et al. 2024 §2.1 (ZB-H1)
    Method.ZB2: zb2_orders,  # Qi et al. 2024 §2.2 (ZB-H2)
    Method.INTERLEAVED_ZB: interleaved_zb_programs,  # interleaved with zb1's split backward (ours)
    Method.ZBV: zbv_programs,  # Qi et al. 2024 §6 (ZB-V)
    Method.DUALPIPEV: dualpipev_programs,  # DeepSeek-AI 2024 §3.2.1 (DualPipe), cut in half onto the V
})
"""Every method's generator (module docstring)."""


def generator_for(method: Method) -> Generator:
    """The method's generator.

    Raises:
        UserError: a method without one, naming those that have one.
    """
    try:
        return GENERATORS[method]
    except KeyError:
        known = ", ".join(m.value for m in GENERATORS)
        raise UserError(f"method {method.value!r} has no schedule generator yet; use one of: {known}") from None
