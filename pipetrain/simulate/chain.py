"""Iteration time of a chain plan under any per-stage compute order, from cost tables.

The max-plus closed form of :mod:`pipetrain.simulate.vectorised` needs the flush order (all
forwards, then all backwards), where the two passes are independent. A 1F1B order interleaves them,
so a stage's forward may wait for a gradient and the other way round; :func:`order_time` instead
plays the orders out, one action at a time, with the same model (docs/algorithms.md §2.3):

* an action starts when its stage is free and the message holding its last sample has arrived
  (forward: from ``k - 1``; backward: from ``k + 1``); it takes ``f[k](b)`` or ``g[k](b)`` seconds
  (``backward_recompute_s`` where the stage's backward partition differs from its forward one);
* a stage with a successor (predecessor) sends each forward output (input gradient) when it is
  computed, over one FIFO link per direction that is busy ``cF[k](b)`` (``cB[k](b)``) seconds;
* ``T = max_k (end of stage k's last action + step[k])``.

This is the event simulator's model of a chain without processor sharing, so both agree
(tested to 1e-9). :func:`split_order_time` does the same for a split backward (method ``zb1``,
Zero Bubble, Qi et al., ICLR 2024): ``B`` in the backward's place, ``W`` a local action;
:func:`interleaved_order_time` for interleaved 1F1B (several stages per rank: one clock per rank,
one FIFO per directed rank pair).
Cost: ``O(actions)`` Python steps per plan, about 0.1–0.5 ms for 4–8 stages of 8–32 micro-batches:
the evaluator of the GA over unequal 1F1B (ZB-H1) plans, one individual at a time.

Shapes: ``forward_sizes[k]`` and ``backward_sizes[k]`` are stage ``k``'s size vectors (each sums to
``B``); ``sequences[k]`` is its order as ``(is_backward, micro-batch index)`` pairs, as
:func:`pipetrain.schedule.one_f_one_b.one_f_one_b_sequences` returns, or for a split backward as
``("F" | "B" | "W", micro-batch index)`` pairs, as :func:`pipetrain.schedule.zero_bubble.zb1_sequences`
returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from pipetrain.schedule.zero_bubble import ZbKind
from pipetrain.simulate.vectorised import StageTables

__all__ = ["interleaved_order_time", "order_time", "split_order_time"]

_NEG_INF = float("-inf")
_B, _W = 1, 2
"""Action codes of :func:`_play_out`: 0 forward, 1 backward (whole, or a split backward's B), 2 W;
``(is_backward, j)`` pairs are the 0/1 case."""
_CODES: dict[ZbKind, int] = {"F": 0, "B": _B, "W": _W}


class _Inbox:
    """Messages arriving at a stage from one neighbour: ``(last sample + 1, arrival)``, in order."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.arrivals: list[float] = []
        self.cursor = 0

    def ready(self, hi: int) -> float | None:
        """Arrival of the message holding sample ``hi - 1``; None if it is not sent yet."""
        i = self.cursor
        while i < len(self.ends) and self.ends[i] < hi:
            i += 1
        self.cursor = i
        return self.arrivals[i] if i < len(self.ends) else None


def order_time(
    sequences: Sequence[Sequence[tuple[bool, int]]],
    forward_sizes: Sequence[Sequence[int]],
    backward_sizes: Sequence[Sequence[int]],
    tables: StageTables,
) -> float:
    """Iteration seconds of one chain plan under the given per-stage orders.

    Raises:
        ValueError: the orders deadlock (no stage can make progress), or sizes and tables disagree.
    """
    f, g_plain, c_f, c_b, g_rc = tables.rows
    n = tables.n_stages
    if not len(sequences) == len(forward_sizes) == len(backward_sizes) == n:
        raise ValueError(f"give an order and sizes for each of the {n} stages")
    g = [g_plain[k] if list(forward_sizes[k]) == list(backward_sizes[k]) else g_rc[k] for k in range(n)]
    programs = [[(kind, k, j) for kind, j in sequence] for k, sequence in enumerate(sequences)]
    free = _play_out(programs, (forward_sizes, backward_sizes), (f, g, c_f, c_b, []), list(range(n)))
    return max(free[k] + float(tables.step_s[k]) for k in range(n))


def split_order_time(
    sequences: Sequence[Sequence[tuple[ZbKind, int]]],
    sizes: Sequence[Sequence[int]],
    tables: StageTables,
) -> float:
    """Iteration seconds of one chain plan whose backward is split into ``B`` and ``W`` (method
    ``zb1``; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2).

    ``B`` takes the place of the backward above and costs ``StageTables.backward_input_s``; ``W``
    starts when its stage is free (its ``B`` ran earlier on the stage), costs
    ``StageTables.weight_grad_s`` and sends nothing. With the orders of
    :func:`~pipetrain.schedule.zero_bubble.zb1_sequences` this is the event simulator's time of the
    ``zb1`` plan with these per-stage sizes (tested to 1e-9).

    Args:
        sequences: per stage, its order as ``(kind, j)`` pairs, kind ``"F"``, ``"B"`` or ``"W"``.
        sizes: per stage, its micro-batch sizes (forward = backward), each summing to ``B``.
        tables: costs with split-backward rows (:meth:`StageTables.from_cost_model`).

    Raises:
        ValueError: the orders deadlock, the sizes and tables disagree, or the tables have no ``B``
            and ``W`` rows.
    """
    n = tables.n_stages
    if not len(sequences) == len(sizes) == n:
        raise ValueError(f"give an order and sizes for each of the {n} stages")
    b_in, w = tables.split_rows
    f, _, c_f, c_b, _ = tables.rows
    programs = [[(_CODES[kind], k, j) for kind, j in sequence] for k, sequence in enumerate(sequences)]
    free = _play_out(programs, (sizes, sizes), (f, b_in, c_f, c_b, w), list(range(n)))
    return max(free[k] + float(tables.step_s[k]) for k in range(n))


def interleaved_order_time(
    orders: Sequence[Sequence[tuple[bool, int, int]]],
    sizes: Sequence[Sequence[int]],
    n_ranks: int,
    tables: StageTables,
) -> float:
    """Iteration seconds of an interleaved plan (Narayanan et al., SC'21): stage ``s`` of ``K = v R``
    on rank ``s mod R``, each stage with its own partition (forward = backward).

    The model above with one clock per *rank*: a rank runs its stages' actions in its order, and
    the messages of two stage pairs between the same two ranks share that directed link (one FIFO
    channel, as in the event simulator). A rank ends with one optimizer step per stage it holds.

    Args:
        orders: per rank, its order as ``(is_backward, stage, j)`` triples, as
            :func:`~pipetrain.schedule.interleaved_unequal.unequal_interleaved_orders` returns.
        sizes: per stage, its micro-batch sizes, each summing to ``B``.
        n_ranks: ``R``.
        tables: per-stage costs, the stages' ranks being ``s mod R``.

    Raises:
        ValueError: the orders deadlock, or sizes and tables disagree.
    """
    n = tables.n_stages
    if len(sizes) != n or len(orders) != n_ranks or n % n_ranks:
        raise ValueError(f"give sizes for each of the {n} stages and an order for each of the {n_ranks} ranks")
    f, g, c_f, c_b, _ = tables.rows
    free = _play_out(orders, (sizes, sizes), (f, g, c_f, c_b, []), [s % n_ranks for s in range(n)])
    return max(free[r] + sum(float(tables.step_s[s]) for s in range(r, n, n_ranks)) for r in range(n_ranks))


class _Chain:
    """The state of :func:`_play_out`: each processor's clock, each link's, and the messages in flight.

    ``owner[k]`` is the processor (stage, or rank) that runs stage ``k``; the links are directed
    processor pairs, so two stage pairs between the same processors share one.
    """

    def __init__(self, sizes: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
                 rows: tuple[list[list[float]], ...], owner: Sequence[int]) -> None:
        n = len(sizes[0])
        self.sizes, self.owner = sizes, owner
        self.f, self.g, self.c_f, self.c_b, self.w = rows
        self.ends = [(list(accumulate(x)), list(accumulate(y))) for x, y in zip(*sizes, strict=True)]
        self.from_up, self.from_down = [_Inbox() for _ in range(n)], [_Inbox() for _ in range(n)]
        pairs = {(owner[k], owner[t]) for k in range(n) for t in (k - 1, k + 1) if 0 <= t < n}
        index = {pair: i for i, pair in enumerate(sorted(pairs))}
        self.up = [index[(owner[k], owner[k + 1])] if k + 1 < n else -1 for k in range(n)]
        self.down = [index[(owner[k], owner[k - 1])] if k else -1 for k in range(n)]
        self.links = [_NEG_INF] * len(index)
        self.free = [0.0] * (max(owner) + 1)

    def step(self, kind: int, k: int, j: int) -> bool:
        """Run stage ``k``'s action ``(kind, j)`` if its input has been sent; False if not yet."""
        n, c = len(self.ends), self.owner[k]
        if kind == _W:  # needs only its own B, earlier on this stage
            self.free[c] += self.w[k][self.sizes[1][k][j]]
            return True
        backward = kind == _B
        hi, size = self.ends[k][backward][j], self.sizes[backward][k][j]
        if backward:
            ready = self.from_down[k].ready(hi) if k < n - 1 else _NEG_INF
        else:
            ready = self.from_up[k].ready(hi) if k > 0 else 0.0
        if ready is None:
            return False
        end = self.free[c] = max(self.free[c], ready) + (self.g[k][size] if backward else self.f[k][size])
        if backward and k > 0:
            arrival = self.links[self.down[k]] = max(self.links[self.down[k]], end) + self.c_b[k][size]
            self.from_down[k - 1].ends.append(hi)
            self.from_down[k - 1].arrivals.append(arrival)
        elif not backward and k < n - 1:
            arrival = self.links[self.up[k]] = max(self.links[self.up[k]], end) + self.c_f[k][size]
            self.from_up[k + 1].ends.append(hi)
            self.from_up[k + 1].arrivals.append(arrival)
        return True


def _play_out(
    programs: Sequence[Sequence[tuple[int, int, int]]],
    sizes: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
    rows: tuple[list[list[float]], ...],
    owner: Sequence[int],
) -> list[float]:
    """Play the programs out: per processor, ``(kind code, stage, j)`` triples; ``sizes``: per stage
    its forward and backward size vectors; ``rows``: per stage ``f``, ``g`` (the backward row it
    pays: with recompute or not, or a split backward's ``B``), ``cF``, ``cB`` and ``W`` by
    micro-batch size; ``owner[k]``: the processor of stage ``k``. Returns when each processor's last
    action ends.

    Raises:
        ValueError: the orders deadlock.
    """
    chain = _Chain(sizes, rows, owner)
    pos = [0] * len(programs)
    remaining = sum(len(s) for s in programs)
    while remaining:
        progressed = False
        for k, sequence in enumerate(programs):
            while pos[k] < len(sequence) and chain.step(*sequence[pos[k]]):
                pos[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"the orders deadlock at positions {pos}")
    return chain.free
