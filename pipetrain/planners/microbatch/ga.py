"""DGAP / TiDGAP: a dual-chromosome genetic algorithm over per-stage micro-batch partitions.

UMPIPE (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804) searches UEDP plans
with DGAP, a GA whose individuals carry one chromosome for forward and one for backward partitions,
and TiDGAP, the same search with a fitness that times many individuals and micro-batches at once.
Only the abstract is public; the operators and hyperparameters here are **pipetrain's
reconstruction** (docs/algorithms.md §2.4):

* individual: forward and backward cut masks ``[K, B]`` (:mod:`.encoding`); population ``[P, K, B]``;
* init: the fastest equal (GPipe) plans, up to half the population, so the result is never worse
  than the best equal flush plan; the rest random with a log-uniform cut density per chromosome,
  half of them with backward = forward;
* fitness: ``-T`` from :func:`~pipetrain.simulate.vectorised.iteration_times` (TiDGAP, one call per
  generation; generation 0, whose plans range from one micro-batch to ``B``, one call per width
  group, :func:`~pipetrain.simulate.grouped.population_times`) or
  :func:`~pipetrain.simulate.loop_time.iteration_time` per individual (DGAP); the two give
  bit-identical times, so the same seed gives the same plan;
* selection: tournament of 3; crossover: pairs cross with p 0.8, swapping each stage's row pair
  (forward and backward together) with p 0.5;
  mutation: each row of **each chromosome independently** (the "dual" part) with p 0.15 flips one
  cut bit or shifts an existing cut by ±1 sample; then each stage with p 0.1 copies one
  chromosome's row onto the other (direction at random); elitism: the 2 best survive; a per-stage
  memory cap is kept by adding cuts;
* two phases (dual mode): for the first half of the generations children keep backward = forward,
  then both chromosomes search freely. Without that coupling a stage whose rows differ pays for
  recompute at almost every mutation, and at equal budget the dual search ended 1-10 % behind the
  single-chromosome one (benchmarks/history/umpipe-sim.md, the ablation);
* single-chromosome ablation: the backward chromosome is the forward one;
* unequal 1F1B (pipetrain's extension): single chromosome, each individual timed under its 1F1B
  order (:func:`~pipetrain.schedule.one_f_one_b.one_f_one_b_sequences`) as
  :func:`~pipetrain.simulate.chain.order_time` times it, the whole population in one call of
  :func:`~pipetrain.simulate.chain_population.population_order_times` (the same times to the last
  bit), seeded with the equal 1F1B plans (pruned by the bound, as TiDGAP's);
* unequal ZB-H1 (pipetrain's extension, planner ``zb1-ga``): the same, each individual timed under its
  ZB-H1 order (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1): the unequal 1F1B
  order with the backward split into ``B`` and ``W``, W deferred as
  :func:`~pipetrain.schedule.zero_bubble.zb1_sequences` defers it, each timed with its own seconds as
  :func:`~pipetrain.simulate.chain.split_order_time` times it (``population_order_times(split=True)``);
  seeded with the equal ZB-H1 plans;
* unequal interleaved 1F1B (:func:`interleaved_ga`): the same for ``v`` stages per rank, timed per
  rank by :func:`~pipetrain.simulate.chain.interleaved_order_time`; seeded with Megatron's equal order.

The hyperparameters and the immutable state are in :mod:`.ga_state` (:class:`GAConfig`,
:class:`~.ga_state.GAState`), the operators in :mod:`.ga_operators`, one generation in
:mod:`.ga_step` (:func:`~.ga_step.ask` and :func:`~.ga_step.tell`, pure apart from drawing from the
``numpy.random.Generator`` passed in: the evotorch functional style of STYLE.md L8); this module
runs the generations (:func:`ga`) and names the planners. Cost per generation: ``O(P K B)`` array
work for the operators and TiDGAP's one evaluation call; DGAP instead runs ``P`` Python loops of
``O(K B)`` each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np

from pipetrain.planners.microbatch.encoding import cuts_to_partition
from pipetrain.planners.microbatch.ga_state import Evaluator, GAConfig, Mode
from pipetrain.planners.microbatch.ga_step import ask, init_state, tell
from pipetrain.planners.microbatch.result import MicrobatchPlan, check_caps
from pipetrain.schedule.interleaved import interleaved_orders
from pipetrain.simulate.chain import interleaved_order_time
from pipetrain.simulate.chain_population import population_order_times
from pipetrain.simulate.grouped import population_times
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import StageTables, iteration_times

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only, so 3.10 runs this module too

__all__ = [
    "EvaluatorKind",
    "GAConfig",
    "GAOptions",
    "OnGeneration",
    "dgap",
    "ga",
    "interleaved_ga",
    "one_f_one_b_ga",
    "single_chromosome",
    "tidgap",
    "zb1_ga",
]

EvaluatorKind = Literal["vectorised", "loop", "1f1b", "zb1", "interleaved"]
OnGeneration = Callable[[int, float], None]


def _evaluator(tables: StageTables, kind: EvaluatorKind, n_ranks: int) -> Evaluator:
    if kind == "vectorised":
        return lambda forward, backward: iteration_times(forward, backward, tables)
    if kind == "loop":
        return lambda forward, backward: np.array([
            iteration_time(cuts_to_partition(f), cuts_to_partition(b), tables)
            for f, b in zip(forward, backward, strict=True)
        ])
    if kind in ("1f1b", "zb1"):  # single chromosome, the whole population at once
        return lambda forward, _: population_order_times(forward, tables, split=kind == "zb1")
    return lambda forward, _: np.array([
        interleaved_order_time(interleaved_orders(sizes, n_ranks), sizes, n_ranks, tables)
        for sizes in map(cuts_to_partition, forward)
    ])


def _planner_name(mode: Mode, evaluator: EvaluatorKind) -> str:
    if evaluator in ("1f1b", "zb1", "interleaved"):
        return f"{evaluator}-ga"
    if mode == "dual":
        return "tidgap" if evaluator == "vectorised" else "dgap"
    return "single" if evaluator == "vectorised" else "single-loop"


def ga(
    tables: StageTables,
    *,
    seed: int = 0,
    config: GAConfig | None = None,
    mode: Mode = "dual",
    evaluator: EvaluatorKind = "vectorised",
    caps: Sequence[int] | None = None,
    on_generation: OnGeneration | None = None,
    n_ranks: int = 1,
) -> MicrobatchPlan:
    """Run the GA and return the fastest plan it saw.

    Args:
        tables: stage costs ``[K, B + 1]``.
        seed: seeds the ``numpy.random.Generator``; the same arguments give the same plan.
        config: hyperparameters (default :class:`GAConfig`).
        mode: ``"dual"`` (independent forward and backward partitions) or ``"single"`` (backward =
            forward, the ablation).
        evaluator: ``"vectorised"`` (the whole population per call: TiDGAP) or ``"loop"`` (one
            individual at a time: DGAP); both time the flush order and give the same plan for a
            seed. ``"1f1b"``, ``"zb1"`` and ``"interleaved"`` (stage ``s`` on rank ``s mod n_ranks``)
            time each individual under its unequal order of that method (``"1f1b"`` and ``"zb1"`` the
            whole population per call; they need ``mode="single"``, and ``"zb1"`` tables with
            split-backward rows).
        caps: per stage, the largest micro-batch allowed; None for no cap.
        on_generation: called as ``on_generation(generation, best_s)`` after each generation
            (1-based), e.g. to drive a progress bar.
        n_ranks: evaluator ``"interleaved"``: the ranks the stages loop over.
    """
    config = config or GAConfig()
    if evaluator in ("1f1b", "zb1", "interleaved") and mode != "single":
        raise ValueError(f"the {evaluator} order needs one partition per stage for both passes: mode='single'")
    caps = check_caps(caps, tables.n_stages)
    rng = np.random.default_rng(seed)
    evaluate = _evaluator(tables, evaluator, n_ranks)
    vectorised = evaluator == "vectorised"
    first = (lambda f, b: population_times(f, b, tables)) if vectorised else evaluate  # widths vary in generation 0
    prune = evaluator in ("vectorised", "1f1b", "zb1")  # evaluators whose seeds the bound covers
    state = init_state(tables, config, rng, first, mode=mode, caps=caps, prune_seeds=prune, split=evaluator == "zb1")
    history = []
    coupled = round(config.coupled_fraction * config.generations) if mode == "dual" else 0
    for generation in range(config.generations):
        phase: Mode = "single" if generation < coupled else mode
        forward, backward = ask(state, config, rng, mode=phase, caps=caps)
        state = tell(state, forward, backward, evaluate(forward, backward), config)
        history.append(state.best_s)
        if on_generation is not None:
            on_generation(state.generation, state.best_s)
    return MicrobatchPlan(cuts_to_partition(state.best_forward), cuts_to_partition(state.best_backward),
                          state.best_s, _planner_name(mode, evaluator), tuple(history))


class GAOptions(TypedDict, total=False):
    """The keyword arguments the named GA planners below pass on to :func:`ga` (meanings there)."""

    seed: int
    config: GAConfig | None
    caps: Sequence[int] | None
    on_generation: OnGeneration | None


def tidgap(tables: StageTables, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """TiDGAP: the dual-chromosome GA on the vectorised evaluator (arguments as for :func:`ga`)."""
    return ga(tables, mode="dual", evaluator="vectorised", **options)


def dgap(tables: StageTables, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """DGAP: the dual-chromosome GA timing one individual at a time (arguments as for :func:`ga`)."""
    return ga(tables, mode="dual", evaluator="loop", **options)


def single_chromosome(tables: StageTables, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """The single-chromosome ablation, backward partition = forward (arguments as for :func:`ga`)."""
    return ga(tables, mode="single", evaluator="vectorised", **options)


def one_f_one_b_ga(tables: StageTables, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """Unequal micro-batches under the 1F1B order: per-stage partitions, forward = backward
    (arguments as for :func:`ga`)."""
    return ga(tables, mode="single", evaluator="1f1b", **options)


def zb1_ga(tables: StageTables, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """Unequal micro-batches under the ZB-H1 order (Qi et al. 2024, §2.1): per-stage partitions,
    forward = backward, the backward split into B and W (arguments as for :func:`ga`; ``tables``
    need split-backward rows)."""
    return ga(tables, mode="single", evaluator="zb1", **options)


def interleaved_ga(tables: StageTables, n_ranks: int, **options: Unpack[GAOptions]) -> MicrobatchPlan:
    """Unequal micro-batches under interleaved 1F1B (Narayanan et al., SC'21): one partition per
    virtual stage, forward = backward, stage ``s`` on rank ``s mod n_ranks``, each individual timed
    by :func:`~pipetrain.simulate.chain.interleaved_order_time` (arguments as for :func:`ga`)."""
    return ga(tables, mode="single", evaluator="interleaved", n_ranks=n_ranks, **options)
