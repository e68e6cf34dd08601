"""Golden schedules: ``build_schedule(plan).to_csv()`` matches tests/golden/schedules/<case>.csv byte for byte.

Each case is a small hand-made Plan (``CASES`` below): gpipe and 1f1b on 2–4 stages with several
micro-batch counts, zb1 (equal, unequal, strict memory), zb2, interleaved, interleaved-zb (also strict memory),
zbv, 1f1b with per-stage unequal partitions, uedp with unequal forward and backward sizes per stage, graph (DAGs of
stages), local learning, the asynchronous pipedream (stashing, vertical sync, replicated) and 2bw over their default
run of batches, replicated stages, and recompute. Every method of :data:`~pipetrain.plan.methods.METHODS` has at
least one case (``test_every_method_has_golden_schedules``). A golden file holds one CSV row per rank, one action
per cell (:meth:`~pipetrain.schedule.schedule.Schedule.to_csv`), so a changed schedule shows up in review as a diff
of the file.

When a schedule changes on purpose, regenerate the files and review the diff::

    .venv/bin/python -m pytest tests/unit/test_golden_schedules.py --update-golden
    git diff tests/golden/schedules

``--update-golden`` (tests/conftest.py) writes every case's file, and deletes files that no case
produces any more. To add a case, add it to ``CASES`` and run the same command.
"""

from __future__ import annotations

import csv
import difflib
import io
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain.plan.methods import METHODS, LocalParams, Method, WeightPolicy, ZeroBubbleParams
from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.generators import build_schedule
from pipetrain.schedule.schedule import Schedule

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "schedules"
REGENERATE = "pytest tests/unit/test_golden_schedules.py --update-golden"


def chain(method: Method, forward: Sequence[Sequence[int]], backward: Sequence[Sequence[int]] | None = None,
          *, recompute: bool = False) -> Plan:
    """One rank per stage; stage ``k`` cuts the batch into ``forward[k]`` (and ``backward[k]``)."""
    backward = forward if backward is None else backward
    stages = tuple(StagePlan((f"l{k}",), (k,), tuple(f), tuple(b), recompute)
                   for k, (f, b) in enumerate(zip(forward, backward, strict=True)))
    return Plan("m", "", sum(forward[0]), method, stages)


def equal(method: Method, n_stages: int, batch: int, n_micro: int, *, recompute: bool = False) -> Plan:
    return chain(method, [equal_sizes(batch, n_micro)] * n_stages, recompute=recompute)


def replicated(method: Method, replicas: Sequence[int], batch: int, n_micro: int,
               weights: WeightPolicy = WeightPolicy.SYNC) -> Plan:
    """Stage ``k`` on ``replicas[k]`` consecutive ranks, every stage with the same equal partition."""
    sizes = equal_sizes(batch, n_micro)
    stages, rank = [], 0
    for k, r in enumerate(replicas):
        stages.append(StagePlan((f"l{k}",), tuple(range(rank, rank + r)), sizes, sizes))
        rank += r
    return Plan("m", "", batch, method, tuple(stages), weights=weights)


def dag(forward: Sequence[Sequence[int]], edges: Sequence[tuple[int, int]]) -> Plan:
    """Method graph: one rank per stage, stage ``k`` cutting the batch into ``forward[k]``, the given stage edges."""
    return replace(chain(Method.GRAPH, forward), edges=tuple(edges))


def local(forward: Sequence[Sequence[int]]) -> Plan:
    """Method local (linear auxiliary heads): one rank per stage, stage ``k`` cutting the batch into ``forward[k]``."""
    return replace(chain(Method.LOCAL, forward), weights=WeightPolicy.LOCAL, params=LocalParams("linear"))


def v_shape(n_ranks: int, batch: int, n_micro: int, method: Method = Method.ZBV) -> Plan:
    """``2 · n_ranks`` stages in a V (zbv, dualpipev): stage ``s`` on rank ``s``, or ``2R − 1 − s`` from ``R`` on."""
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (v_rank(k, n_ranks),), sizes, sizes) for k in range(2 * n_ranks))
    return Plan("m", "", batch, method, stages)


def looping(method: Method, n_ranks: int, chunks: int, batch: int, n_micro: int) -> Plan:
    """``chunks · n_ranks`` stages, stage ``s`` on rank ``s mod n_ranks`` (interleaved methods)."""
    sizes = equal_sizes(batch, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (k % n_ranks,), sizes, sizes) for k in range(n_ranks * chunks))
    return Plan("m", "", batch, method, stages)


def looping_unequal(n_ranks: int, partitions: Sequence[tuple[int, ...]]) -> Plan:
    """Method interleaved, stage ``s`` on rank ``s mod n_ranks`` cutting the batch into ``partitions[s]``."""
    stages = tuple(StagePlan((f"l{k}",), (k % n_ranks,), f, f) for k, f in enumerate(partitions))
    return Plan("m", "", sum(partitions[0]), Method.INTERLEAVED, stages)


STRICT = ZeroBubbleParams(strict_memory=True)

CASES: dict[str, Callable[[], Plan]] = {
    # Equal partitions; batch 10 in 7 micro-batches gives sizes (2, 2, 2, 1, 1, 1, 1).
    **{
        f"{method.value}-s{n_stages}-m{n_micro}": (lambda m=method, s=n_stages, n=n_micro: equal(m, s, 10, n))
        for method in (Method.GPIPE, Method.ONE_F_ONE_B)
        for n_stages in (2, 3, 4)
        for n_micro in (1, 2, 5, 7)
    },
    # 1F1B with a partition per stage (forward = backward on each stage).
    "1f1b-unequal-s2": lambda: chain(Method.ONE_F_ONE_B, [[2, 2, 2, 2, 2, 2], [6, 6]]),
    "1f1b-unequal-s3": lambda: chain(Method.ONE_F_ONE_B, [[4, 4, 4], [2, 2, 2, 2, 2, 2], [6, 3, 3]]),
    "1f1b-unequal-s4": lambda: chain(Method.ONE_F_ONE_B, [[1, 2, 3, 6], [3, 3, 3, 3], [12], [2, 4, 6]]),
    # uedp: per-stage forward and backward partitions that differ (those stages recompute).
    "uedp-s2": lambda: chain(Method.UEDP, [[4, 4], [2, 2, 2, 2]], [[8], [3, 5]]),
    "uedp-s3": lambda: chain(Method.UEDP, [[4, 4, 4], [6, 6], [3, 3, 3, 3]], [[2, 2, 2, 2, 2, 2], [12], [4, 4, 4]]),
    "uedp-s4": lambda: chain(
        Method.UEDP, [[3, 3, 3, 3], [4, 4, 4], [6, 6], [2, 2, 2, 2, 2, 2]], [[4, 4, 4], [12], [3, 3, 3, 3], [5, 7]]
    ),
    # Replicated stages: micro-batches go round-robin to a stage's ranks.
    "gpipe-replicated-2x1-m4": lambda: replicated(Method.GPIPE, [2, 1], 8, 4),
    "gpipe-replicated-1x3-m5": lambda: replicated(Method.GPIPE, [1, 3], 10, 5),
    "1f1b-replicated-1x2x1-m4": lambda: replicated(Method.ONE_F_ONE_B, [1, 2, 1], 8, 4),
    "1f1b-replicated-2x2-m6": lambda: replicated(Method.ONE_F_ONE_B, [2, 2], 12, 6),
    "1f1b-replicated-1x1x2x1-m5": lambda: replicated(Method.ONE_F_ONE_B, [1, 1, 2, 1], 10, 5),
    # zb1 (ZB-H1): backward split into B and W, stage k deferring at most k W actions.
    "zb1-s2-m4": lambda: equal(Method.ZB1, 2, 8, 4),
    "zb1-s4-m7": lambda: equal(Method.ZB1, 4, 10, 7),
    "zb1-s4-m2": lambda: equal(Method.ZB1, 4, 8, 2),
    "zb1-unequal-s3": lambda: chain(Method.ZB1, [[4, 4, 4], [2, 2, 2, 2, 2, 2], [6, 3, 3]]),
    # zb1 with ZeroBubbleParams(strict_memory=True): no stage holds more micro-batches than under 1F1B.
    "zb1-strict-s3-m5": lambda: replace(equal(Method.ZB1, 3, 10, 5), params=STRICT),
    "zb1-strict-s4-m7": lambda: replace(equal(Method.ZB1, 4, 10, 7), params=STRICT),
    # zb2 (ZB-H2): zb1 with 2(K - k) - 1 warm-up forwards on stage k.
    "zb2-s2-m4": lambda: equal(Method.ZB2, 2, 8, 4),
    "zb2-s3-m5": lambda: equal(Method.ZB2, 3, 10, 5),
    "zb2-unequal-s3": lambda: chain(Method.ZB2, [[4, 4, 4], [2, 2, 2, 2, 2, 2], [6, 3, 3]]),
    # interleaved: v chunks per rank, stage s on rank s mod R; per-stage partitions by list scheduling.
    "interleaved-r2-v2-m4": lambda: looping(Method.INTERLEAVED, 2, 2, 8, 4),
    "interleaved-r3-v2-m5": lambda: looping(Method.INTERLEAVED, 3, 2, 10, 5),
    "interleaved-r2-v3-m3": lambda: looping(Method.INTERLEAVED, 2, 3, 6, 3),
    "interleaved-unequal-r2-v2": lambda: looping_unequal(2, [(2, 2, 2, 2), (4, 4), (2, 6), (8,)]),
    # interleaved-zb: interleaved 1F1B with B and deferred W, rank r deferring at most 2r W actions.
    "interleaved-zb-r2-v2-m4": lambda: looping(Method.INTERLEAVED_ZB, 2, 2, 8, 4),
    "interleaved-zb-r3-v2-m5": lambda: looping(Method.INTERLEAVED_ZB, 3, 2, 10, 5),
    "interleaved-zb-strict-r2-v2-m4": lambda: replace(looping(Method.INTERLEAVED_ZB, 2, 2, 8, 4), params=STRICT),
    "interleaved-zb-strict-r3-v2-m5": lambda: replace(looping(Method.INTERLEAVED_ZB, 3, 2, 10, 5), params=STRICT),
    # zbv (ZB-V): two stages per rank in a V; no message between stages R-1 and R (the same rank).
    "zbv-r2-m4": lambda: v_shape(2, 8, 4),
    "zbv-r3-m5": lambda: v_shape(3, 10, 5),
    # dualpipev (DeepSeek's DualPipeV): the V, a forward of one chunk paired with a backward of the other.
    "dualpipev-r2-m4": lambda: v_shape(2, 8, 4, Method.DUALPIPEV),
    "dualpipev-r3-m7": lambda: v_shape(3, 14, 7, Method.DUALPIPEV),
    # graph (GraphPipe): 1F1B over a DAG of stages; a skip edge, two sources joining, per-stage partitions.
    "graph-skip-s3-m4": lambda: dag([[2, 2, 2, 2]] * 3, [(0, 1), (0, 2), (1, 2)]),
    "graph-join-s3-m5": lambda: dag([[2, 2, 2, 2, 2]] * 3, [(0, 2), (1, 2)]),
    "graph-unequal-s3": lambda: dag([[2, 2, 2, 2, 2, 2], [6, 6], [4, 4, 4]], [(0, 1), (0, 2), (1, 2)]),
    # local (PPLL): F, B, STEP per micro-batch on every stage, activations only between stages.
    "local-s2-m4": lambda: local([[2, 2, 2, 2]] * 2),
    "local-unequal-s3": lambda: local([[2, 2, 2, 2, 2], [5, 5], [4, 3, 3]]),
    # Asynchronous methods over their default run of batches: every F and B with its weight version.
    "pipedream-s2-m2": lambda: replicated(Method.PIPEDREAM, [1, 1], 4, 2, WeightPolicy.STASH),
    "pipedream-s3-m3": lambda: replicated(Method.PIPEDREAM, [1, 1, 1], 6, 3, WeightPolicy.STASH),
    "pipedream-vsync-s3-m3": lambda: replicated(Method.PIPEDREAM, [1, 1, 1], 6, 3, WeightPolicy.VERTICAL_SYNC),
    "pipedream-replicated-2x1-m4": lambda: replicated(Method.PIPEDREAM, [2, 1], 8, 4, WeightPolicy.STASH),
    "2bw-s2-m2": lambda: replicated(Method.TWO_BW, [1, 1], 4, 2, WeightPolicy.TWO_BW),
    "2bw-s3-m4": lambda: replicated(Method.TWO_BW, [1, 1, 1], 8, 4, WeightPolicy.TWO_BW),
    # Recompute on every stage: the runtime re-runs forward, the schedule itself is unchanged.
    "gpipe-recompute-s3-m4": lambda: equal(Method.GPIPE, 3, 8, 4, recompute=True),
    "1f1b-recompute-s3-m4": lambda: equal(Method.ONE_F_ONE_B, 3, 8, 4, recompute=True),
}


def _cells(text: str) -> list[str]:
    """One line per action, prefixed by its rank: a readable unit for a diff."""
    return [f"rank {rank}: {cell}" for rank, row in enumerate(csv.reader(io.StringIO(text))) for cell in row]


def _mismatch(name: str, expected: str, got: str) -> str:
    diff = "\n".join(difflib.unified_diff(_cells(expected), _cells(got), f"golden/{name}.csv", "build_schedule",
                                          lineterm="", n=2))
    return (f"schedule {name!r} differs from tests/golden/schedules/{name}.csv:\n{diff}\n\n"
            f"If the change is intended, regenerate with `{REGENERATE}` and review `git diff tests/golden`.")


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_matches_golden(name: str, update_golden: bool) -> None:
    schedule = build_schedule(CASES[name]())
    got = schedule.to_csv()
    path = GOLDEN / f"{name}.csv"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != got.encode():
            path.write_bytes(got.encode())
        return
    if not path.exists():
        pytest.fail(f"no golden file tests/golden/schedules/{name}.csv; create it with `{REGENERATE}`")
    expected = path.read_bytes().decode()
    if got != expected:
        pytest.fail(_mismatch(name, expected, got), pytrace=False)
    assert Schedule.from_csv(expected) == schedule


@pytest.mark.parametrize("method", list(METHODS), ids=lambda m: m.value)
def test_every_method_has_golden_schedules(method: Method) -> None:
    """A new method of :data:`~pipetrain.plan.methods.METHODS` needs a case here (its golden file follows)."""
    assert any(make().method is method for make in CASES.values()), (
        f"method {method.value} has no golden schedule; add a case for it to CASES in "
        f"tests/unit/test_golden_schedules.py and run `{REGENERATE}`")


def test_no_stale_golden_files(update_golden: bool) -> None:
    """Every golden file belongs to a case (a renamed case must not leave its old file behind)."""
    stale = sorted(p for p in GOLDEN.glob("*.csv") if p.stem not in CASES)
    if update_golden:
        for p in stale:
            p.unlink()
        return
    assert not stale, f"golden files with no case: {[p.name for p in stale]}; delete them with `{REGENERATE}`"
