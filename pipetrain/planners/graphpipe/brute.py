"""The exhaustive reference for GraphPipe on small graphs: every convex partition, simulated.

    best = brute_force(problem, max_stages=4)
    best.iteration_s        # the fastest simulated plan of method graph, one device per stage

Every partition of the layers into at most ``max_stages`` convex sets (C1, GraphPipe §3.2) whose
stage graph is acyclic, one device per stage, at every equal partition of the batch into
micro-batches of a power-of-two size (:func:`~.planner.micro_batch_options`), is simulated
(:func:`~pipetrain.planners.score.score`) and memory-checked. The set partitions are enumerated as
restricted growth strings: Bell(L) of them, so keep ``L <= 8``.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipetrain.errors import UserError
from pipetrain.planners.contract import Candidate, PlanningProblem, rank_key
from pipetrain.planners.graphpipe.planner import micro_batch_options
from pipetrain.planners.graphpipe.sp import reachability
from pipetrain.planners.graphpipe.stages import layer_edges, to_plan
from pipetrain.planners.score import memory_checked, score

__all__ = ["brute_force", "convex", "set_partitions"]

MAX_LAYERS = 10


def set_partitions(n: int, max_blocks: int) -> Iterator[list[tuple[int, ...]]]:
    """Every partition of ``0..n-1`` into at most ``max_blocks`` blocks, each block increasing."""
    labels = [0] * n

    def extend(i: int, used: int) -> Iterator[list[tuple[int, ...]]]:
        if i == n:
            yield [tuple(j for j in range(n) if labels[j] == k) for k in range(used)]
            return
        for k in range(min(used + 1, max_blocks)):
            labels[i] = k
            yield from extend(i + 1, max(used, k + 1))

    if n:
        yield from extend(1, 1)


def convex(block: tuple[int, ...], reach: list[int]) -> bool:
    """Whether no path leaves ``block`` and comes back (C1)."""
    mask = sum(1 << i for i in block)
    below = 0
    for i in block:
        below |= reach[i]
    outside = below & ~mask
    return not any(reach[x] & mask for x in range(outside.bit_length()) if outside >> x & 1)


def brute_force(problem: PlanningProblem, max_stages: int | None = None) -> Candidate:
    """The fastest feasible plan over every convex partition (module docstring).

    Args:
        problem: a model of at most ``MAX_LAYERS`` layers.
        max_stages: at most this many stages; default the cluster's device count.

    Raises:
        UserError: too many layers, or no partition fits memory.
    """
    names = problem.layer_names
    if len(names) > MAX_LAYERS:
        raise UserError(f"the brute-force reference enumerates every partition; give it at most {MAX_LAYERS} layers, "
                        f"not {len(names)}")
    edges = layer_edges(problem)
    reach = reachability(len(names), edges)
    limit = min(max_stages or problem.cost.cluster.n_devices, problem.cost.cluster.n_devices)
    best: Candidate | None = None
    for blocks in set_partitions(len(names), limit):
        if not all(convex(b, reach) for b in blocks):
            continue
        for sizes in micro_batch_options(problem.batch_size, problem.smallest_microbatch):
            try:
                plan, cluster = to_plan(problem, edges, [(b, 1) for b in blocks], sizes)
            except UserError:
                break  # the stage graph has a cycle, whatever the sizes
            sub = problem.cost.on(cluster)
            c = memory_checked(score(plan, sub, label="brute force"), sub, problem.optimizer)
            if c.feasible and (best is None or rank_key(c) < rank_key(best)):
                best = c
    if best is None:
        raise UserError("no partition fits the devices' memory; use a smaller batch or devices with more memory")
    return best
