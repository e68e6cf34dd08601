"""Schedule.directed_links: the (src, dst) pairs its SENDs use, sorted, as every rank computes them."""

from __future__ import annotations

from pipetrain.plan.methods import Method
from pipetrain.plan.placement import v_rank
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.schedule.generators import build_schedule


def _plan(method: Method, n_stages: int, n_ranks: int) -> Plan:
    sizes = equal_sizes(8, 2)
    rank = (lambda k: v_rank(k, n_ranks)) if method is Method.ZBV else (lambda k: k % n_ranks)
    stages = tuple(StagePlan((f"l{k}",), (rank(k),), sizes, sizes) for k in range(n_stages))
    return Plan("links", "", 8, method, stages)


def test_a_chain_sends_both_ways_between_neighbours() -> None:
    assert build_schedule(_plan(Method.ONE_F_ONE_B, 3, 3)).directed_links() == ((0, 1), (1, 0), (1, 2), (2, 1))


def test_a_v_has_no_link_for_its_same_rank_hand_off() -> None:
    """ZB-V on 2 ranks: stages 1 and 2 share rank 1, so only 0 <-> 1 carries messages."""
    assert build_schedule(_plan(Method.ZBV, 4, 2)).directed_links() == ((0, 1), (1, 0))


def test_a_single_stage_sends_nothing() -> None:
    assert build_schedule(_plan(Method.GPIPE, 1, 1)).directed_links() == ()
