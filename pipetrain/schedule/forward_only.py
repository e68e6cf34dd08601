"""Forward-only schedules: the plan's pipeline without backward, for evaluation.

Evaluation runs the same stages, ranks and micro-batch partitions as training, on an eval batch of
``n`` samples (the last batch of the eval set may be smaller than the plan's ``B``): each stage's
forward sizes are cut at ``n``, the fill-drain order (GPipe's, per-stage sizes allowed) keeps
every forward, and the backward actions, their communication and the optimizer step are dropped.
For stage sizes ``(8, 8, 8, 8)`` and ``n = 20`` a stage forwards ``(8, 8, 4)``::

    rank 0:  F0[0:8] SEND_F0[0:8]>1  F1[8:16] SEND_F1[8:16]>1  F2[16:20] SEND_F2[16:20]>1
    rank 1:  RECV_F0[0:8]<0 F0[0:8]  RECV_F1[8:16]<0 F1[8:16]  RECV_F2[16:20]<0 F2[16:20]

Removing the backward half of a deadlock-free GPipe program removes only ordering constraints, so
the forward-only program cannot deadlock either. A replica of a replicated stage may get no
micro-batch of a small last batch (an empty program), which training plans may not have.
"""

from __future__ import annotations

from dataclasses import replace

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, Backward, Method, MethodParams, methods_where
from pipetrain.plan.placement import Placement
from pipetrain.plan.plan import Plan
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import compute_schedule
from pipetrain.schedule.passes import add_communication
from pipetrain.schedule.schedule import Schedule

__all__ = ["clip_sizes", "forward_only_schedule"]

_FORWARD_KINDS = (ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F)


def clip_sizes(sizes: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The micro-batch sizes covering the first ``n`` samples: ``clip_sizes((8, 8, 8), 12) == (8, 4)``."""
    out: list[int] = []
    left = n
    for size in sizes:
        if left <= 0:
            break
        out.append(min(size, left))
        left -= out[-1]
    return tuple(out)


def _forward_order(plan: Plan) -> Method:
    """The method whose order the forward-only program keeps, by the plan's placement: one stage per
    rank, the fill-drain order with each stage's own partition (``uedp``: any clipped sizes); several,
    an order of the placement that takes any number of micro-batches (an eval batch may have fewer
    than the plan), the fused-backward one first (looping: ``interleaved``; V: ``zbv``, also for
    ``dualpipev``), else the plan's own."""
    if plan.placement is Placement.SINGLE:
        return Method.UEDP
    same = methods_where(placement=plan.placement, flush=True, microbatches_per_stage=False)
    fused = [m for m in same if METHODS[m].backward is Backward.FUSED]
    return (*fused, *same, plan.method)[0]


def forward_only_schedule(plan: Plan, n: int) -> Schedule:
    """Every rank's forward-only program for an eval batch of ``n`` samples (``1 <= n <= B``).

    Raises:
        UserError: ``n`` outside ``[1, B]``.
    """
    if not 1 <= n <= plan.batch_size:
        raise UserError(f"an eval batch of {n} samples does not fit the plan's batch of {plan.batch_size}")
    clipped = [clip_sizes(s.forward_sizes, n) for s in plan.stages]
    stages = tuple(replace(s, forward_sizes=c, backward_sizes=c, recompute=False)
                   for s, c in zip(plan.stages, clipped, strict=True))
    method = _forward_order(plan)
    forward = replace(plan, batch_size=n, method=method, stages=stages, prediction=None,
                      weights=METHODS[method].weights[0], params=MethodParams())
    full = add_communication(compute_schedule(forward), forward)  # no plan check: a replica may get no micro-batch
    return Schedule.from_lists([[a for a in program if a.kind in _FORWARD_KINDS] for _, program in full])
