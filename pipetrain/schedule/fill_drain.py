"""Fill-drain: every forward, then every backward, then the step (methods ``gpipe`` and ``uedp``).

GPipe (Huang et al. 2019), with a flush; ``m`` micro-batches on stage ``k``::

    F0 F1 ... F(m-1) B0 B1 ... B(m-1) STEP

Backward runs in forward sample order, as in the timing model of docs/algorithms.md §2.3, so every
stage consumes gradients in the order its successor produces them. UMPIPE's ``uedp`` runs the same
order with each stage's own forward and backward partitions (a stage whose two differ recomputes,
:meth:`~pipetrain.plan.plan.Plan.recomputes`): forward ``j`` covers ``forward_sizes``' ``j``-th
range, backward ``j`` ``backward_sizes``'; the communication pass re-chunks the messages by sample
range. All of a stage's micro-batches are in flight at once (1F1B holds at most ``K − k``).
"""

from __future__ import annotations

from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.orders import Orders, backwards, forwards

__all__ = ["gpipe_orders"]


def gpipe_orders(plan: Plan) -> Orders:
    """Per stage, all forwards, then all backwards, then the step (module docstring)."""
    return [
        [*forwards(k, s.forward_sizes), *backwards(k, s.backward_sizes), Action(ActionKind.STEP, k)]
        for k, s in enumerate(plan.stages)
    ]
