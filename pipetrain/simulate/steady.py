"""Steady state of an asynchronous pipeline: samples/s once full, and the cost of filling it.

An asynchronous method (``pipedream``, ``2bw``; docs/algorithms.md §3.5) never flushes, so one
batch's iteration time says little: the first batch pays the warm-up, the last the drain, and the
batches between them overlap. The event simulator runs the run-long schedule for ``n`` and ``2n``
batches; their difference is ``n`` steady-state batches::

    T(N) ≈ warmup_s + N · batch_s          batch_s = (T(2n) − T(n)) / n,  warmup_s = T(n) − n · batch_s

    steady = steady_state(plan, cost)        # SteadyState(batch_s=..., warmup_s=..., samples_per_s=...)

Method ``local`` (PPLL) needs no flush either: no gradient crosses a stage, so each stage streams
micro-batches through F, local B and STEP, held back only by its bounded queues. Its steady state is
taken the same way, on ``n`` and ``2n`` consecutive batches run as one stream
(:meth:`~pipetrain.plan.plan.Plan.repeated`), and comes to one micro-batch per
``max over stages of (F + B + head + STEP)`` (transfers overlap compute on their own link, so a link
slower than every stage sets the pace instead). pipetrain's runtime runs one batch per schedule, so
a run of it pays ``warmup_s`` once per batch (its iteration time), not once per run.

For any other synchronous method every batch is the same, so ``batch_s`` is its iteration time and
``warmup_s`` is 0.

An asynchronous run that checkpoints every ``c`` steps drains its pipeline there
(:mod:`pipetrain.schedule.segments`): every segment of ``c`` batches pays the fill and the drain,

    drained samples/s = c · B / (warmup_s + c · batch_s)         steady.drained_samples_per_s(c)

(the same linear model of ``T``, applied to one segment).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain.cost import CostModel
from pipetrain.plan.plan import Plan
from pipetrain.schedule.generators import DEFAULT_ASYNC_BATCHES, build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline

__all__ = ["SteadyState", "steady_state", "steady_timeline"]


@dataclass(frozen=True)
class SteadyState:
    """Attributes: batch_s: seconds per batch once the pipeline is full; warmup_s: the extra seconds
    of filling and draining it, once per run; samples_per_s: ``B / batch_s``."""

    batch_s: float
    warmup_s: float
    samples_per_s: float

    def drained_samples_per_s(self, every: int) -> float:
        """Samples/s of a run that drains the pipeline every ``every`` batches (module docstring); the
        steady state's when ``every`` is 0 (never)."""
        if every <= 0 or self.batch_s <= 0:
            return self.samples_per_s
        return every * self.samples_per_s * self.batch_s / (self.warmup_s + every * self.batch_s)


def steady_state(plan: Plan, cost: CostModel, batches: int = DEFAULT_ASYNC_BATCHES) -> SteadyState:
    """Simulate ``batches`` and ``2 · batches`` batches of ``plan`` (module docstring)."""
    return steady_timeline(plan, cost, batches)[0]


def steady_timeline(plan: Plan, cost: CostModel, batches: int = DEFAULT_ASYNC_BATCHES) -> tuple[SteadyState, Timeline]:
    """:func:`steady_state` and the simulated timeline of ``batches`` batches (one batch when synchronous),
    for the bubble and activation peaks a planner's prediction reports."""
    if not plan.spec.gradients_cross_stages:  # local learning: a stream of batches through bounded queues
        short, long = (simulate(build_schedule(run), run, cost)
                       for run in (plan.repeated(batches), plan.repeated(2 * batches)))
    elif not plan.asynchronous:
        timeline = simulate(build_schedule(plan), plan, cost)
        batch_s = timeline.iteration_s
        return SteadyState(batch_s, 0.0, plan.batch_size / batch_s if batch_s > 0 else 0.0), timeline
    else:
        short, long = (simulate(build_schedule(plan, n), plan, cost) for n in (batches, 2 * batches))
    batch_s = (long.iteration_s - short.iteration_s) / batches
    steady = SteadyState(batch_s, max(0.0, short.iteration_s - batches * batch_s),
                         plan.batch_size / batch_s if batch_s > 0 else 0.0)
    return steady, short
