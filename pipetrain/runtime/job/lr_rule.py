"""The learning-rate rule of the asynchronous methods: each stage's rate from the base rate (docs/algorithms.md §3.7).

    rates = stage_rates(plan, "auto")              # pipedream, 2 stages, 4 micro-batches of 8
    rates.scales                                   # (0.25, 0.25): --lr × 1/4 on both stages
    rates.describe(3e-3)                           # one line for the run's output: rule, reason, rates

``--lr`` is tuned for a synchronous step: one optimizer step per batch of ``B`` samples, on the mean
gradient of the batch. ``pipedream`` (``MethodSpec.loss_per_microbatch``) steps stage ``k``, on ``r_k``
replicas, ``s_k = m / r_k`` times per batch of ``m`` equal micro-batches, each step on ``r_k``
micro-batch means summed (``B·r_k/m`` samples; the sum is ``r_k`` times their mean). At the same
rate it moves its weights about ``m`` times as far per batch (``s_k`` steps, each ``r_k`` times a mean
gradient's), on gradients up to the ``n_k`` micro-batches in flight old (weight stashing, §3.5).
Rule ``auto`` scales every stage's rate by one micro-batch's share of the batch::

    lr_k = lr / m          (every optimizer, whatever the stage's replicas)

For SGD, with or without momentum, the update is linear in the gradient, so ``s_k`` steps of
``lr/m`` on sums of ``r_k`` micro-batch means move the weights as one step of ``lr`` on the batch
mean (to first order; with momentum ``β``, the same holds of its steady-state step ``lr/(1−β)``):
the linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD", arXiv:1706.02677, §2.1)
read from batch ``B`` down to ``B·r_k/m``, on the summed (not averaged) gradient of the replicas.
PipeDream's own code (msr-fiddle/pipedream) averages a replicated stage's gradients and scales its
rate by ``r_k / r_0``: the same steps as here. (The rule was ``lr · r_k/m`` until 2026-11-28, which
moved a replicated stage ``r_k`` times as far per batch as one synchronous step.)
For Adam and AdamW, whose step is about ``lr`` in size whatever the gradient's scale, the square-root
rule for adaptive methods (Malladi et al. 2022,
arXiv:2205.10287) would be ``lr · √(r_k/m)``; measured at equal samples, the linear rule trained
better (gpt-tiny: 45.3 % next-byte accuracy against 42.5 %, 1f1b 44.8 %; mlp-digits: both within a
point of 1f1b; benchmarks/history/async-convergence.md, "the learning-rate rule"), so ``auto`` uses it
for every optimizer. Adam's betas, ``eps``
and the weight decay coefficient stay as given (AdamW's decay per step scales with the rate, so it
too totals one synchronous step's per batch).

``2bw`` steps once per batch on the batch's mean gradient, one step late (``W(t+1) = W(t) − ν∇f(W(t−1))``);
its paper finds that this delay needs no change to the optimizer's hyper-parameters (Narayanan et al.
2021: 2BW "converges like vanilla Adam") and half or twice the rate measured worse here, so ``auto``
leaves its rate as given, as it does for every method that steps once per batch. ``none`` runs every stage at ``--lr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan

__all__ = ["LR_RULES", "LRRule", "StageRates", "check_lr_rule", "stage_rates"]

LRRule = Literal["auto", "none"]
LR_RULES: Final[tuple[LRRule, ...]] = get_args(LRRule)


@dataclass(frozen=True)
class StageRates:
    """Every stage's learning rate as a multiple of the base rate, and why.

    Attributes:
        rule: the rule that chose them (``"auto"`` or ``"none"``).
        scales: per stage, in stage order, the factor on the base rate (1.0: the rate as given).
        reason: why the factors are what they are, for the run's output.
    """

    rule: LRRule
    scales: tuple[float, ...]
    reason: str

    @property
    def changed(self) -> bool:
        """Whether some stage runs at a rate other than the base rate."""
        return any(s != 1.0 for s in self.scales)

    def describe(self, lr: float) -> str:
        """One line: the rule, the reason and each stage's effective rate at base rate ``lr``."""
        distinct = sorted(set(self.scales), reverse=True)
        if len(distinct) == 1:
            rates = f"every stage at {lr:g} × {distinct[0]:.4g} = {lr * distinct[0]:.4g}"
        else:
            rates = ", ".join(f"stage {k} at {lr * s:.4g}" for k, s in enumerate(self.scales))
        off = f"; --lr-rule none keeps {lr:g}" if self.changed else ""
        return f"learning rate (--lr-rule {self.rule}): {rates}: {self.reason}{off}"


def check_lr_rule(rule: str) -> LRRule:
    """``rule`` as an :data:`LRRule`.

    Raises:
        UserError: an unknown rule, naming the choices.
    """
    if rule not in LR_RULES:
        raise UserError(f"--lr-rule {rule!r} is unknown; use one of {', '.join(LR_RULES)}")
    return rule  # type: ignore[return-value]  # checked against LR_RULES above


def stage_rates(plan: Plan, rule: str) -> StageRates:
    """Each stage's rate factor under ``rule`` for ``plan``, whatever its optimizer (module docstring).

    Raises:
        UserError: an unknown rule.
    """
    checked = check_lr_rule(rule)
    ones = (1.0,) * plan.n_stages
    if checked == "none":
        return StageRates(checked, ones, "the rate as given")
    if not plan.spec.loss_per_microbatch:
        why = "steps once per batch" + (", one step late" if plan.asynchronous else "")
        return StageRates(checked, ones, f"{plan.method.value} {why}, as --lr assumes")
    m = len(plan.stages[0].forward_sizes)
    scales = (1 / m,) * plan.n_stages  # a stage on r ranks steps m/r times on r micro-batch means summed
    reason = (f"{plan.method.value} steps once per micro-batch ({m} per batch; a stage on r ranks steps on r "
              "micro-batches' gradients summed, m/r times), at --lr / m to move as far per batch as one "
              "synchronous step")
    return StageRates(checked, scales, reason)
