"""The runs of async-convergence: each a method, its learning-rate rule and a factor on ``--lr``.

``RUNS`` tests the rule (:mod:`pipetrain.runtime.job.lr_rule`) on and off; ``SWEEP`` the candidate
rates the rule was chosen from, each set by hand with the rule off. A run with a rule that changes
nothing is the same run, so it is trained once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipetrain.plan.methods import Method
from pipetrain.runtime.job.lr_rule import LRRule

__all__ = ["RUNS", "SWEEP", "Run"]


@dataclass(frozen=True)
class Run:
    """One training run: a method, the rule and a factor on ``--lr`` given by hand."""

    label: str
    method: Method
    vertical_sync: bool
    rule: LRRule
    lr_factor: float = 1.0

    @property
    def family(self) -> str:
        """The method, vertical sync apart."""
        return "pipedream-vsync" if self.vertical_sync else self.method.value


PD, TWO_BW, SYNC = Method.PIPEDREAM, Method.TWO_BW, Method.ONE_F_ONE_B
RUNS = (
    Run("1f1b", SYNC, False, "auto"),
    Run("pipedream, rule auto", PD, False, "auto"),
    Run("pipedream, rule none", PD, False, "none"),
    Run("pipedream-vsync, rule auto", PD, True, "auto"),
    Run("pipedream-vsync, rule none", PD, True, "none"),
    Run("2bw", TWO_BW, False, "auto"),
    Run("2bw, lr ×1/2", TWO_BW, False, "none", 0.5),
)
FACTORS = {"1": 1.0, "1/2": 0.5, "1/4": 0.25, "1/8": 0.125}
SWEEP = (
    Run("1f1b", SYNC, False, "none"),
    *(Run(f"pipedream, lr ×{k}", PD, False, "none", f) for k, f in FACTORS.items()),
    *(Run(f"pipedream-vsync, lr ×{k}", PD, True, "none", f) for k, f in FACTORS.items()),
    *(Run(f"2bw, lr ×{k}", TWO_BW, False, "none", f) for k, f in {"2": 2.0, "1": 1.0, "1/2": 0.5}.items()),
)
