"""Zero-bubble orders: 1F1B with the backward split into ``B`` and ``W`` (methods ``zb1``, ``zb2``).

Qi, Wan, Huang and Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1 ("memory efficient
schedule", ZB-H1). A backward splits into ``B``, the gradient of the stage's input (what the
previous stage waits for), and ``W``, the gradient of its weights (what only the optimizer step
waits for). ``B`` keeps 1F1B's place, so gradients travel upstream without waiting for weight
gradients; ``W`` is deferred to fill the pipeline's bubbles. A micro-batch's activations are
held from its ``F`` to its ``W``.

ZB-H1's rule, as pipetrain builds it: stage ``k`` of ``K`` runs 1F1B's F/B order (warm-up ``w_k =
K - k - 1`` forwards), and defers at most ``d_k = K - 1 - w_k = k`` W actions: after each ``B``,
the oldest pending ``W`` runs once more than ``d_k`` are pending, and, once the stage has no
forward left (the cool-down), after every ``B``; the rest run before the step. Every stage then
holds at most ``w_k + 1 + d_k = K`` micro-batches from F to W, which is 1F1B's peak (stage 0's):
the first stage, which holds the most under 1F1B, holds no more, and later stages use memory 1F1B
left unused. With ``T_F = T_B = T_W`` the bubble shrinks from 1F1B's ``(K-1)(T_F+T_B+T_W)`` towards
ZB-H1's ``(K-1)(T_F+T_B-T_W)``, a third (the paper's Figure 3). ``K = 2``, ``m = 4``::

    stage 0:  F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 STEP
    stage 1:  F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 STEP

Unequal micro-batches (each stage its own partition, forward = backward): the F/B order is
pipetrain's unequal 1F1B order (:func:`~pipetrain.schedule.one_f_one_b.one_f_one_b_sequences`, whose
second rule may add forwards a successor needs); before such a forward, pending W actions run first
while the stage already holds ``K`` micro-batches, so the count bound holds there too. W actions
depend on nothing but their own B, so inserting them never creates a deadlock.

ZB-H2 (the paper's §2.2, method ``zb2``): stage ``k`` warms up with ``2 (K − k) − 1`` forwards, the
forwards that fit before its first B can arrive when F, B and W take one unit each (the first B reaches
stage ``k`` at ``2K − 1 − k``, its first F at ``k``), holds at most ``2K − 1`` micro-batches from F to
W (twice 1F1B's peak, less one) and defers W without a count bound, running one after each B in the
cool-down. The paper's ZB-H2 reaches zero bubble because its optimizer post-validation lets the next
iteration start while the last stages finish. With pipetrain's synchronous STEP no order beats
``T* = m (T_F + T_B + T_W) + (K − 1) · T_F`` (the last stage cannot start before ``K − 1`` forwards and
then has all of its own work to do). In the simulator at constant costs (tests/unit/test_zero_bubble_h2.py)
ZB-H2 is never slower than ZB-H1, reaches ``T*`` when ``T_B ≤ T_W`` for ``m ≥ 2K``, and otherwise
removes part of ZB-H1's excess over ``T*`` (``(K − 1)(T_B − T_W)`` when ``T_F ≥ T_B ≥ T_W``):
with ``T_F = T_B = T_W`` both reach ``T*`` and ZB-H2's extra memory buys nothing; its gain is where B
costs more than W (e.g. ``T_F = 1, T_B = 1.5, T_W = 0.5``, ``K = 4``: half of ZB-H1's excess). ``K = 2``, ``m = 4``::

    stage 0:  F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 STEP
    stage 1:  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3 STEP

The memory-strict variant of ZB-H1 (:func:`strict_memory_sequences`) is the plan's parameter
``ZeroBubbleParams(strict_memory=True)`` (:class:`~pipetrain.plan.methods.ZeroBubbleParams`), which
:func:`zb1_orders` reads. The zero-bubble methods cannot run replicated stages yet.

Data: per stage a list of ``(kind, j)`` with kind ``"F"``, ``"B"`` or ``"W"`` and ``j`` the
micro-batch index in the stage's own partition; every ``j`` appears once per kind. The generators
(:func:`zb1_orders`, :func:`zb2_orders`) turn them into actions with sample ranges, each stage's
program ending in its STEP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from pipetrain.errors import UserError
from pipetrain.plan.methods import ZeroBubbleParams
from pipetrain.plan.plan import Plan, ranges
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.one_f_one_b import one_f_one_b_sequences
from pipetrain.schedule.orders import Orders, Sequences, check_one_partition

__all__ = ["ZbKind", "place_weight_grads", "strict_memory", "strict_memory_sequences", "zb1_orders", "zb1_sequences",
           "zb2_in_flight", "zb2_orders", "zb2_sequences"]

ZbKind = Literal["F", "B", "W"]
Item = TypeVar("Item")  # what an action runs on: a micro-batch index, or (chunk, micro-batch) (interleaved-zb)


def zb1_sequences(fb_orders: Sequence[Sequence[tuple[bool, int]]], deferred: Sequence[int] | None = None,
                  bounds: Sequence[int] | None = None, cooldown: bool = True) -> list[list[tuple[ZbKind, int]]]:
    """Per stage, the ZB-H1 order: its 1F1B order with W actions placed (module docstring).

    Args:
        fb_orders: per stage of ``K``, its 1F1B order as ``(is_backward, j)`` pairs.
        deferred: per stage, the most W actions it may defer; default ``d_k = k`` (ZB-H1).
        bounds: per stage, the most micro-batches held from F to W before a forward; default ``K``.
        cooldown: once no forward is left, run one W after every B (ZB-H1); False: defer up to
            ``deferred`` there too.

    :func:`strict_memory_sequences` is the variant that holds no more than 1F1B on every stage.
    """
    n = len(fb_orders)
    delays = list(deferred) if deferred is not None else list(range(n))
    limits = list(bounds) if bounds is not None else [n] * n
    return [place_weight_grads(order, delays[k], limits[k], cooldown) for k, order in enumerate(fb_orders)]


def zb2_in_flight(n_stages: int) -> list[int]:
    """ZB-H2's warm-up: per stage ``k``, the ``2 (K − k) − 1`` micro-batches it forwards before its first
    B (the ``in_flight`` bound of :func:`~pipetrain.schedule.one_f_one_b.one_f_one_b_sequences`)."""
    return [2 * (n_stages - k) - 1 for k in range(n_stages)]


def zb2_sequences(fb_orders: Sequence[Sequence[tuple[bool, int]]]) -> list[list[tuple[ZbKind, int]]]:
    """Per stage, the ZB-H2 order (module docstring) from its F/B order with :func:`zb2_in_flight`'s
    warm-up: at most ``2K − 1`` micro-batches held from F to W, W deferred without a count bound."""
    n = len(fb_orders)
    return zb1_sequences(fb_orders, [len(order) for order in fb_orders], [2 * n - 1] * n)


def strict_memory_sequences(fb_orders: Sequence[Sequence[tuple[bool, int]]]) -> list[list[tuple[ZbKind, int]]]:
    """A memory-strict variant (not the paper's, not a method): stage ``k`` holds at most its own
    1F1B count ``K - k`` from F to W and defers at most its warm-up's ``K - k - 1`` W actions, so in
    steady state each W follows its B and only the cool-down's W actions move after later B actions.
    Every stage's activation bytes are then exactly 1F1B's (benchmarks/bench_zb.py compares it)."""
    n = len(fb_orders)
    return zb1_sequences(fb_orders, [n - k - 1 for k in range(n)], [n - k for k in range(n)], cooldown=False)


def place_weight_grads(order: Sequence[tuple[bool, Item]], delay: int, bound: int,
                       cooldown: bool = True) -> list[tuple[ZbKind, Item]]:
    """One program's order: ``order``'s F and B (``(is_backward, item)`` pairs), with a W after each B
    placed by the rule of the module docstring: at most ``delay`` W actions pending after a B (and
    none during the cool-down when ``cooldown``), at most ``bound`` items held from F to W before a
    forward unless nothing is pending, the rest before the step. ``item`` is a stage's micro-batch
    index (``zb1``) or a rank's ``(chunk, micro-batch)`` (``interleaved-zb``,
    :mod:`pipetrain.schedule.interleaved_zb`)."""
    forwards_left = sum(not backward for backward, _ in order)
    pending: deque[Item] = deque()
    held = 0
    out: list[tuple[ZbKind, Item]] = []
    for backward, j in order:
        if not backward:
            while pending and held >= bound:
                out.append(("W", pending.popleft()))
                held -= 1
            out.append(("F", j))
            held += 1
            forwards_left -= 1
            continue
        out.append(("B", j))
        pending.append(j)
        if len(pending) > delay or (cooldown and forwards_left == 0):
            out.append(("W", pending.popleft()))
            held -= 1
    out += [("W", j) for j in pending]
    return out


def strict_memory(plan: Plan) -> bool:
    """Whether the plan asks for the memory-strict variant (:class:`~pipetrain.plan.methods.ZeroBubbleParams`)."""
    return isinstance(plan.params, ZeroBubbleParams) and plan.params.strict_memory


def zb1_orders(plan: Plan) -> Orders:
    """ZB-H1 orders (§2.1, module docstring): each stage's 1F1B order (equal or per-stage unequal
    partitions) with its backward split into B and W, at most ``k`` W actions deferred on stage ``k``;
    with ``strict_memory`` (:func:`strict_memory`) the variant that holds no more than 1F1B on every
    stage (:func:`strict_memory_sequences`).

    Raises:
        UserError: a stage whose forward and backward sizes differ, or a replicated stage.
    """
    sequences = one_f_one_b_sequences([s.forward_sizes for s in plan.stages])
    return _split_orders(plan, sequences, strict_memory_sequences if strict_memory(plan) else zb1_sequences)


def zb2_orders(plan: Plan) -> Orders:
    """ZB-H2 orders (§2.2, module docstring): 1F1B with ``2 (K − k) − 1`` warm-up forwards on stage
    ``k``, the backward split into B and W, at most ``2K − 1`` micro-batches held from F to W.

    Raises:
        UserError: a stage whose forward and backward sizes differ, or a replicated stage.
    """
    sequences = one_f_one_b_sequences([s.forward_sizes for s in plan.stages], zb2_in_flight(plan.n_stages))
    return _split_orders(plan, sequences, zb2_sequences)


def _split_orders(plan: Plan, sequences: Sequences,
                  place: Callable[[Sequences], list[list[tuple[ZbKind, int]]]]) -> Orders:
    """The stages' F/B ``sequences`` with W placed by ``place``, as actions, each program ending in its STEP."""
    if plan.replicated:
        raise UserError("the zero-bubble methods cannot run replicated stages yet; give every stage one rank "
                        "or use method 1f1b")
    check_one_partition(plan.stages)
    orders = []
    for k, (stage, sequence) in enumerate(zip(plan.stages, place(sequences), strict=True)):
        spans = ranges(stage.forward_sizes)
        actions = [Action(ActionKind(kind), k, j, *spans[j]) for kind, j in sequence]
        orders.append([*actions, Action(ActionKind.STEP, k)])
    return orders
