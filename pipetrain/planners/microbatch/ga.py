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
  single-chromosome one (BENCHMARKS.md, UMPIPE ablation);
* single-chromosome ablation: the backward chromosome is the forward one;
* unequal 1F1B (pipetrain's extension): single chromosome, each individual timed under its 1F1B
  order (:func:`~pipetrain.schedule.generators.one_f_one_b_sequences`) by
  :func:`~pipetrain.simulate.chain.order_time`, one at a time, seeded with the equal 1F1B plans;
* unequal ZB-H1 (pipetrain's extension, planner ``zb1-ga``): the same, each individual timed under its
  ZB-H1 order (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1): the unequal 1F1B
  order with the backward split into ``B`` and ``W``, W deferred by
  :func:`~pipetrain.schedule.zero_bubble.zb1_sequences`, each timed with its own seconds by
  :func:`~pipetrain.simulate.chain.split_order_time`; seeded with the equal ZB-H1 plans;
* unequal interleaved 1F1B (:func:`interleaved_ga`): the same for ``v`` stages per rank, timed per
  rank by :func:`~pipetrain.simulate.chain.interleaved_order_time`; seeded with Megatron's equal order.

The state is an immutable :class:`GAState`; :func:`ask` and :func:`tell` are pure apart from drawing
from the ``numpy.random.Generator`` passed in (the evotorch functional style of STYLE.md L8). Cost
per generation: ``O(P K B)`` array work for the operators and TiDGAP's one evaluation call; DGAP
instead runs ``P`` Python loops of ``O(K B)`` each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, TypedDict

import numpy as np
import numpy.typing as npt

from pipetrain.planners.microbatch.encoding import BoolArray, Partition, cap_cuts, cuts_to_partition, equal_seeds
from pipetrain.planners.microbatch.result import MicrobatchPlan, check_caps
from pipetrain.planners.microbatch.seeding import fastest_seeds, seed_bounds
from pipetrain.schedule.generators import one_f_one_b_sequences
from pipetrain.schedule.interleaved import interleaved_orders
from pipetrain.schedule.zero_bubble import zb1_sequences
from pipetrain.simulate.chain import interleaved_order_time, order_time, split_order_time
from pipetrain.simulate.grouped import population_times
from pipetrain.simulate.loop_time import iteration_time
from pipetrain.simulate.vectorised import StageTables, iteration_times

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; annotations only, so 3.10 runs this module too

__all__ = [
    "EvaluatorKind",
    "GAConfig",
    "GAOptions",
    "GAState",
    "Mode",
    "OnGeneration",
    "ask",
    "dgap",
    "ga",
    "init_state",
    "interleaved_ga",
    "one_f_one_b_ga",
    "single_chromosome",
    "tell",
    "tidgap",
    "zb1_ga",
]

FloatArray = npt.NDArray[np.float64]
Mode = Literal["dual", "single"]
EvaluatorKind = Literal["vectorised", "loop", "1f1b", "zb1", "interleaved"]
Evaluator = Callable[[BoolArray, BoolArray], FloatArray]
"""``(forward [N, K, B], backward [N, K, B]) -> [N]`` iteration seconds."""
OnGeneration = Callable[[int, float], None]


@dataclass(frozen=True)
class GAConfig:
    """GA hyperparameters (pipetrain's choices; the paper's are unknown).

    Attributes:
        population: individuals per generation ``P``.
        generations: generations ``G`` to run.
        tournament: contestants per tournament.
        pair_crossover_p: probability that a pair of parents crosses over.
        row_swap_p: in a crossing pair, probability that a stage's rows (forward and backward
            together) are swapped.
        row_mutation_p: probability that a row (one stage of one chromosome) mutates.
        row_sync_p: dual mode, probability that a stage's forward row is copied onto its backward
            one or the reverse, so that equal rows (no recompute) are easy to reach.
        coupled_fraction: dual mode, the share of the generations, first, in which children keep
            backward = forward (a single-chromosome phase); the rest search both freely.
        elite: best individuals copied unchanged into the next generation.
    """

    population: int = 128
    generations: int = 500
    tournament: int = 3
    pair_crossover_p: float = 0.8
    row_swap_p: float = 0.5
    row_mutation_p: float = 0.15
    row_sync_p: float = 0.1
    coupled_fraction: float = 0.5
    elite: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.elite < self.population:
            raise ValueError(f"elite ({self.elite}) must be >= 0 and below the population ({self.population})")
        if self.generations < 0 or self.tournament < 1:
            raise ValueError("generations must be >= 0 and tournament >= 1")
        for name in ("pair_crossover_p", "row_swap_p", "row_mutation_p", "row_sync_p", "coupled_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]")


class GAState(NamedTuple):
    """One generation, immutable (its arrays are read-only).

    Attributes:
        forward: ``[P, K, B]`` forward cut masks.
        backward: ``[P, K, B]`` backward cut masks.
        times_s: ``[P]`` iteration seconds of each individual.
        best_forward: ``[K, B]`` the fastest individual seen so far, forward.
        best_backward: ``[K, B]`` its backward masks.
        best_s: its iteration seconds.
        generation: generations completed.
    """

    forward: BoolArray
    backward: BoolArray
    times_s: FloatArray
    best_forward: BoolArray
    best_backward: BoolArray
    best_s: float
    generation: int


def _freeze(*arrays: npt.NDArray[np.generic]) -> None:
    for array in arrays:
        array.setflags(write=False)


def _state(forward: BoolArray, backward: BoolArray, times: FloatArray, previous: GAState | None) -> GAState:
    """A state whose best is the better of ``previous``'s best and this population's (ties: older)."""
    i = int(np.argmin(times))
    generation = 0 if previous is None else previous.generation + 1
    if previous is not None and previous.best_s <= times[i]:
        best = (previous.best_forward, previous.best_backward, previous.best_s)
    else:
        best = (forward[i].copy(), backward[i].copy(), float(times[i]))
    _freeze(forward, backward, times, best[0], best[1])
    return GAState(forward, backward, times, best[0], best[1], best[2], generation)


# ---- operators --------------------------------------------------------------------------------


def _random_cuts(n: int, n_stages: int, batch: int, rng: np.random.Generator) -> BoolArray:
    """``[n, K, B]`` random masks; each individual has its own cut density, log-uniform in [1/B, 1]."""
    density = np.exp(rng.uniform(math.log(1.0 / batch), 0.0, size=n))
    cuts = rng.random((n, n_stages, batch)) < density[:, None, None]
    cuts[..., -1] = True
    return cuts


def _tournament(times: FloatArray, n: int, size: int, rng: np.random.Generator) -> npt.NDArray[np.intp]:
    """Indices of ``n`` winners of tournaments of ``size`` (ties: the first drawn)."""
    contestants = rng.integers(0, len(times), size=(n, size))
    winners: npt.NDArray[np.intp] = contestants[np.arange(n), np.argmin(times[contestants], axis=1)]
    return winners


def _crossover(
    parents: npt.NDArray[np.intp], n_stages: int, config: GAConfig, rng: np.random.Generator
) -> npt.NDArray[np.intp]:
    """Which parent each child's stage rows come from: pairs ``(parents[2i], parents[2i + 1])``
    swap stage rows.

    Args:
        parents: ``[2n]`` indices into the population.

    Returns:
        ``[2n, K]`` population index per child and stage: first the children that start from
        ``parents[2i]``, then their mates. Index a ``[P, K, B]`` chromosome with it and
        ``arange(K)`` to get the children's rows.
    """
    a, b = parents[0::2, None], parents[1::2, None]
    crosses = rng.random(len(a)) < config.pair_crossover_p
    swap = (rng.random((len(a), n_stages)) < config.row_swap_p) & crosses[:, None]
    source: npt.NDArray[np.intp] = np.concatenate([np.where(swap, b, a), np.where(swap, a, b)])
    return source


def _sync(forward: BoolArray, backward: BoolArray, p_row: float, rng: np.random.Generator) -> None:
    """In place: each stage with ``p_row`` copies its forward row onto its backward one or the reverse."""
    who, stage = np.nonzero(rng.random(forward.shape[:2]) < p_row)
    to_backward = rng.random(len(who)) < 0.5
    fb, bf = (who[to_backward], stage[to_backward]), (who[~to_backward], stage[~to_backward])
    backward[fb] = forward[fb]
    forward[bf] = backward[bf]


def _mutate(cuts: BoolArray, p_row: float, rng: np.random.Generator) -> None:
    """In place on ``[N, K, B]`` masks: each row mutates with ``p_row``: shift a random existing cut
    by ±1, else flip a random bit.

    A row chooses shift or flip with p 1/2; a shift that has no cut to move, or would move it off
    the row or onto another cut, becomes a flip. The last column is never touched.
    """
    batch = cuts.shape[-1]
    if batch == 1:
        return
    who, stage = np.nonzero(rng.random(cuts.shape[:2]) < p_row)
    rows, n = cuts[who, stage], len(who)
    flip_at = rng.integers(0, batch - 1, size=n)
    wants_shift = rng.random(n) < 0.5
    step = 2 * rng.integers(0, 2, size=n) - 1
    keys = np.where(rows[:, :-1], rng.random((n, batch - 1)), -1.0)
    src = np.argmax(keys, axis=1)
    dst = src + step
    each = np.arange(n)
    in_row = (dst >= 0) & (dst <= batch - 2)
    ok = wants_shift & (keys[each, src] >= 0.0) & in_row
    ok &= ~rows[each, np.where(in_row, dst, src)]
    rows[each, np.where(ok, src, flip_at)] ^= True  # a shift clears its cut (set), a flip flips
    shifted = np.flatnonzero(ok)
    rows[shifted, dst[shifted]] = True
    cuts[who, stage] = rows


# ---- ask / tell -------------------------------------------------------------------------------


def init_state(
    tables: StageTables,
    config: GAConfig,
    rng: np.random.Generator,
    evaluate: Evaluator,
    *,
    mode: Mode = "dual",
    caps: Sequence[int] | None = None,
    prune_seeds: bool = False,
) -> GAState:
    """Generation 0: the fastest equal plans (up to half of ``P``), the rest random.

    The kept equal plans are timed once (:func:`~pipetrain.planners.microbatch.seeding.fastest_seeds`);
    ``prune_seeds`` (TiDGAP) skips those that a lower bound proves slower, with the same result.
    """
    n_stages, batch = tables.n_stages, tables.batch_size
    seeds = cap_cuts(equal_seeds(n_stages, batch), caps)
    n_keep = min(batch, math.ceil(config.population / 2))
    bounds = seed_bounds(seeds, tables) if prune_seeds and n_keep < batch else None  # else every seed is kept
    keep, seed_times = fastest_seeds(seeds, n_keep, evaluate, bounds)
    n_random = config.population - len(keep)
    forward = cap_cuts(_random_cuts(n_random, n_stages, batch, rng), caps)
    backward = forward
    if mode == "dual":
        backward = forward.copy()
        half = n_random // 2
        backward[half:] = cap_cuts(_random_cuts(n_random - half, n_stages, batch, rng), caps)
    times = np.concatenate([seed_times, evaluate(forward, backward) if n_random else []])
    forward, backward = np.concatenate([seeds[keep], forward]), np.concatenate([seeds[keep], backward])
    return _state(forward, backward, times, None)


def ask(
    state: GAState,
    config: GAConfig,
    rng: np.random.Generator,
    *,
    mode: Mode = "dual",
    caps: Sequence[int] | None = None,
) -> tuple[BoolArray, BoolArray]:
    """The ``P - elite`` children of ``state``: forward and backward masks ``[P - elite, K, B]``."""
    n_kids = config.population - config.elite
    parents = _tournament(state.times_s, 2 * math.ceil(n_kids / 2), config.tournament, rng)
    source = _crossover(parents, state.forward.shape[1], config, rng)[:n_kids]
    rows = np.arange(state.forward.shape[1])
    forward = state.forward[source, rows]
    _mutate(forward, config.row_mutation_p, rng)
    if mode == "single":
        forward = cap_cuts(forward, caps)
        return forward, forward
    backward = state.backward[source, rows]
    _mutate(backward, config.row_mutation_p, rng)
    _sync(forward, backward, config.row_sync_p, rng)
    return cap_cuts(forward, caps), cap_cuts(backward, caps)


def tell(state: GAState, forward: BoolArray, backward: BoolArray, times_s: FloatArray, config: GAConfig) -> GAState:
    """The next generation: ``state``'s ``elite`` best, then the evaluated children."""
    elite = np.argsort(state.times_s, kind="stable")[: config.elite]
    return _state(
        np.concatenate([state.forward[elite], forward]),
        np.concatenate([state.backward[elite], backward]),
        np.concatenate([state.times_s[elite], times_s]),
        state,
    )


# ---- drivers ----------------------------------------------------------------------------------


def _ordered_time(tables: StageTables, kind: EvaluatorKind, n_ranks: int) -> Callable[[Partition], float]:
    """Seconds of one per-stage partition (forward = backward) under the order ``kind`` names."""
    if kind == "1f1b":
        return lambda sizes: order_time(one_f_one_b_sequences(sizes), sizes, sizes, tables)
    if kind == "zb1":
        return lambda sizes: split_order_time(zb1_sequences(one_f_one_b_sequences(sizes)), sizes, tables)
    return lambda sizes: interleaved_order_time(interleaved_orders(sizes, n_ranks), sizes, n_ranks, tables)


def _evaluator(tables: StageTables, kind: EvaluatorKind, n_ranks: int) -> Evaluator:
    if kind == "vectorised":
        return lambda forward, backward: iteration_times(forward, backward, tables)
    if kind == "loop":
        return lambda forward, backward: np.array([
            iteration_time(cuts_to_partition(f), cuts_to_partition(b), tables)
            for f, b in zip(forward, backward, strict=True)
        ])
    time_one = _ordered_time(tables, kind, n_ranks)
    return lambda forward, _: np.array([time_one(cuts_to_partition(cuts)) for cuts in forward])  # single chromosome


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
            time each individual under its unequal order of that method (:func:`_ordered_time`; they
            need ``mode="single"``, and ``"zb1"`` tables with split-backward rows).
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
    state = init_state(tables, config, rng, first, mode=mode, caps=caps, prune_seeds=vectorised)
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
