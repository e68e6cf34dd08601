"""Micro-batch planners: how each stage splits the batch (UMPIPE's UEDP, docs/algorithms.md §2).

Planners take :class:`~pipetrain.simulate.vectorised.StageTables` (per-stage cost by micro-batch
size) and return a :class:`MicrobatchPlan`; :func:`plan_uedp` turns one into a ``uedp`` Plan.

==========  ==================================================================
``equal``   :func:`best_equal`: the best equal count (GPipe's micro-batching)
``greedy``  :func:`local_greedy`: each stage its own saturation-bounded best size
``dp``      :func:`global_dp`: stage by stage, an exact DP for the stage's own finish
``dgap``    :func:`dgap`: the dual-chromosome GA, one individual timed at a time
``tidgap``  :func:`tidgap`: the same GA on the vectorised evaluator
``single``  :func:`single_chromosome`: the GA with backward partition = forward
``1f1b-ga`` :func:`~.ga.one_f_one_b_ga`: the GA under the 1F1B order, forward = backward
``zb1-ga``  :func:`~.ga.zb1_ga`: the GA under the ZB-H1 order (Qi et al. 2024), forward = backward
``interleaved-ga`` :func:`~.ga.interleaved_ga`: the GA per virtual stage of an interleaved plan
==========  ==================================================================

:data:`ALGORITHMS` says which method each one's plan runs and which are genetic algorithms.
:func:`microbatch_caps` bounds each stage's micro-batch by its device's memory (docs/algorithms.md §2.6).
"""

from pipetrain.planners.microbatch.caps import fits_without_recompute, microbatch_caps
from pipetrain.planners.microbatch.dp import global_dp
from pipetrain.planners.microbatch.encoding import (
    Partition,
    cap_cuts,
    cuts_to_partition,
    cuts_to_sizes,
    equal_seeds,
    partition_to_cuts,
    sizes_to_cuts,
)
from pipetrain.planners.microbatch.equal import best_equal
from pipetrain.planners.microbatch.ga import dgap, ga, single_chromosome, tidgap
from pipetrain.planners.microbatch.ga_state import GAConfig, GAState
from pipetrain.planners.microbatch.ga_step import ask, init_state, tell
from pipetrain.planners.microbatch.greedy import local_greedy, saturation_point
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.planners.microbatch.uedp import (
    ALGORITHMS,
    GA_PLANNERS,
    PLANNER_NAMES,
    MicrobatchAlgorithm,
    PlannerName,
    plan_uedp,
    run_microbatch_planner,
)
from pipetrain.simulate.vectorised import StageTables

__all__ = [
    "ALGORITHMS",
    "GA_PLANNERS",
    "PLANNER_NAMES",
    "GAConfig",
    "GAState",
    "MicrobatchAlgorithm",
    "MicrobatchPlan",
    "Partition",
    "PlannerName",
    "StageTables",
    "ask",
    "best_equal",
    "cap_cuts",
    "cuts_to_partition",
    "cuts_to_sizes",
    "dgap",
    "equal_seeds",
    "fits_without_recompute",
    "ga",
    "global_dp",
    "init_state",
    "local_greedy",
    "microbatch_caps",
    "partition_to_cuts",
    "plan_uedp",
    "run_microbatch_planner",
    "saturation_point",
    "single_chromosome",
    "sizes_to_cuts",
    "tell",
    "tidgap",
]
