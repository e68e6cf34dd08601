"""Local learning's order: forward, local backward and step per micro-batch (method ``local``).

PPLL (Guo et al. 2024, docs/algorithms.md §6): every stage trains on its own loss (an auxiliary
head; the model's loss on the last stage) and steps its optimizer after every micro-batch, so no
gradient crosses a stage. ``m`` micro-batches on stage ``k``::

    F0 B0 STEP F1 B1 STEP ... F(m-1) B(m-1) STEP

The communication pass adds only RECV_F before and SEND_F after each F (the method's
``gradients_cross_stages`` trait is False); the bounded queues between stages are the plan's
``params.queue_depth`` (the validator's dry run and the simulator block a send while its link holds
that many unreceived messages; the runtime keeps that many receives posted and that many sends
outstanding per link).
"""

from __future__ import annotations

from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import Action, ActionKind
from pipetrain.schedule.orders import Orders, backwards, forwards

__all__ = ["local_orders"]


def local_orders(plan: Plan) -> Orders:
    """Per stage, ``F j, B j, STEP`` for every micro-batch ``j`` (module docstring).

    Raises:
        UserError: a stage whose forward and backward sizes differ.
    """
    orders = []
    for k, s in enumerate(plan.stages):
        if s.forward_sizes != s.backward_sizes:
            raise UserError(f"stage {k}: method local updates per micro-batch and needs equal forward and backward "
                            "micro-batch sizes; give the stage one partition")
        fwd, bwd = forwards(k, s.forward_sizes), backwards(k, s.backward_sizes)
        orders.append([a for f, b in zip(fwd, bwd, strict=True) for a in (f, b, Action(ActionKind.STEP, k))])
    return orders
