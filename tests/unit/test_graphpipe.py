"""GraphPipe planner (GraphPipe §3.3–3.5): SP decomposition, DP + TPS search, plans of method graph,
against the exhaustive reference on small DAGs."""

from __future__ import annotations

import functools
import random
import time
from itertools import pairwise

import pytest
from torch import nn

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Layer, LayerGraph, TensorSpec
from pipetrain.plan.methods import Method
from pipetrain.plan.stage_graph import induced_edges, validate_for_graph
from pipetrain.planners.contract import ModelRef, PlanningProblem
from pipetrain.planners.graphpipe import GraphPipeReport, plan_graphpipe
from pipetrain.planners.graphpipe.brute import brute_force, convex, set_partitions
from pipetrain.planners.graphpipe.costs import StageEstimator
from pipetrain.planners.graphpipe.dp import _Solver, search, twins
from pipetrain.planners.graphpipe.planner import micro_batch_options, path_floor_s, stage_floor_s, work_floor_s
from pipetrain.planners.graphpipe.sp import decompose, reachability
from pipetrain.planners.graphpipe.stages import layer_edges, place, to_plan
from pipetrain.planners.registry import run_planner
from pipetrain.planners.score import score
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.simulate.memory import overflows

LINK = Link(5e-6, 1e10)


class Cat(nn.Module):
    def forward(self, *xs: object) -> object:
        import torch

        return torch.cat(xs, -1)  # type: ignore[arg-type]


def toy_graph() -> LayerGraph:
    """a → b1 → b2 and c1 merge in m, then the head h (the DAG of the runtime's tests)."""
    lin = functools.partial
    layers = (Layer("a", lin(nn.Linear, 4, 8)), Layer("b1", lin(nn.Linear, 8, 8)), Layer("c1", lin(nn.Linear, 4, 3)),
              Layer("b2", lin(nn.Linear, 8, 5)), Layer("m", Cat), Layer("h", lin(nn.Linear, 8, 3)))
    edges = (("a", "b1"), ("b1", "b2"), ("b2", "m"), ("c1", "m"), ("m", "h"))
    return LayerGraph("toy", layers, TensorSpec((4,)), TensorSpec((), "int64", high=3), edges=edges)


def dag_problem(names: list[str], edges: list[tuple[str, str]], work: list[float], *, n_devices: int = 4,
                batch: int = 8, memory: int = 1 << 40, saved: int = 1000, params: int = 1000) -> PlanningProblem:
    """A synthetic DAG: layer ``i`` takes ``1e-4 + work[i] · b · 1e-4`` s forward, twice that backward."""
    layers = tuple(LayerProfile(n, (1, 64), (1e-4 + w * 1e-4, 1e-4 + w * 64e-4), (2e-4 + w * 2e-4, 2e-4 + w * 128e-4),
                                4096, saved, params, 0.0) for n, w in zip(names, work, strict=True))
    profile = Profile("dag", "", "cpu", "synthetic", 4096, layers, edges=tuple(edges))
    cluster = Cluster.local(n_devices, link=LINK, memory_bytes=memory)
    return PlanningProblem(ModelRef("dag", "", tuple(names), tuple(edges)), CostModel(profile, cluster), batch)


def random_sp_dag(seed: int, max_layers: int = 7) -> tuple[list[str], list[tuple[str, str]], list[float]]:
    """An optional stem, 2–3 branches of 1–2 layers, a merge layer and an optional head; seeded."""
    rng = random.Random(seed)
    while True:
        stem, head = rng.random() < 0.5, rng.random() < 0.5
        lengths = [rng.randint(1, 2) for _ in range(rng.randint(2, 3))]
        if stem + head + sum(lengths) + 1 <= max_layers:
            break
    names = ["s"] if stem else []
    edges: list[tuple[str, str]] = []
    for k, n in enumerate(lengths):
        chain = [f"b{k}_{i}" for i in range(n)]
        names += chain
        edges += [*pairwise(chain), (chain[-1], "m")]
        edges += [("s", chain[0])] if stem else []
    names += ["m", *(["h"] if head else [])]
    edges += [("m", "h")] if head else []
    return names, edges, [rng.uniform(0.5, 4.0) for _ in names]


def branches(n_branches: int, depth: int) -> tuple[list[str], list[tuple[str, str]]]:
    """MMT's shape (GraphPipe App. A.2): ``n_branches`` chains of ``depth`` layers, concatenated, then a head."""
    names, edges = [], []
    for k in range(n_branches):
        chain = [f"t{k}_{i}" for i in range(depth)]
        names += chain
        edges += [*pairwise(chain), (chain[-1], "cat")]
    return [*names, "cat", "head"], [*edges, ("cat", "head")]


# ---- SP decomposition ---------------------------------------------------------------------------------------

def test_sp_decomposition_recovers_series_and_parallel_structure() -> None:
    toy = toy_graph()
    index = {n: i for i, n in enumerate(toy.names)}
    tree = decompose(len(toy), [(index[a], index[b]) for a, b in toy.edges])
    assert tree.describe() == "S(P(S(0,1,3),2),4,5)"  # (a, b1, b2) beside c1, then m, then h
    assert [c.kind for c in tree.children] == ["parallel", "leaf", "leaf"]
    assert decompose(4, []).describe() == "S(0,1,2,3)"  # a chain is one series node
    assert decompose(1, []).kind == "leaf"
    names, edges = branches(4, 8)
    where = {n: i for i, n in enumerate(names)}
    mmt = decompose(len(names), [(where[a], where[b]) for a, b in edges])
    assert mmt.kind == "series" and [c.kind for c in mmt.children] == ["parallel", "leaf", "leaf"]
    assert [len(c.layers) for c in mmt.children[0].children] == [8] * 4
    assert all(c.kind == "series" and len(c.children) == 8 for c in mmt.children[0].children)
    # two sources both feeding two sinks (complete bipartite) is a series of two parallels
    assert decompose(5, [(0, 2), (0, 3), (1, 2), (1, 3), (2, 4), (3, 4)]).describe() == "S(P(0,1),P(2,3),4)"


def test_a_non_sp_part_is_linearised_and_still_planned() -> None:
    # the "N": 0→2, 1→2, 1→3 has no series cut and is connected
    tree = decompose(5, [(0, 2), (1, 2), (1, 3), (2, 4), (3, 4)])
    assert tree.describe() == "S(L(0,1,2,3),4)" and tree.children[0].linearised
    names = ["x0", "x1", "x2", "x3", "out"]
    edges = [("x0", "x2"), ("x1", "x2"), ("x1", "x3"), ("x2", "out"), ("x3", "out")]
    result = plan_graphpipe(dag_problem(names, edges, [1.0] * 5, params=10**8))
    result.plan.validate(names, None)


# ---- plans ----------------------------------------------------------------------------------------------------

def test_toy_dag_plan_is_valid_and_close_to_brute_force() -> None:
    graph = toy_graph()
    cost = CostModel(estimate_profile(graph, "v100", 16), Cluster.local(4, link=LINK))
    problem = PlanningProblem(ModelRef.of(graph), cost, batch_size=16)
    result = run_planner("graphpipe", problem)
    plan = result.plan
    validate_for_graph(plan, graph)  # C1, C2, topological numbering
    assert plan.method is Method.GRAPH and plan.edges == induced_edges(graph, [s.layers for s in plan.stages])
    assert plan.prediction is not None and isinstance(result.report, GraphPipeReport)
    assert sorted(r for s in plan.stages for r in s.ranks) == list(range(plan.n_ranks))
    assert result.candidates[0].plan == plan
    assert plan.prediction.iteration_s <= 1.15 * brute_force(problem).iteration_s


@pytest.mark.parametrize("seed", range(6))
def test_random_sp_dags_are_within_15_percent_of_brute_force(seed: int) -> None:
    names, edges, work = random_sp_dag(seed)
    # heavy weights: data parallelism costs an all-reduce, so the stages must pipeline as brute force's do
    problem = dag_problem(names, edges, work, n_devices=4, batch=8, params=10**8)
    result = plan_graphpipe(problem)
    result.plan.validate(names, None)
    assert result.plan.prediction is not None
    assert result.plan.prediction.iteration_s <= 1.15 * brute_force(problem).iteration_s


def test_light_weights_let_graphpipe_beat_one_device_per_stage() -> None:
    names, edges, work = random_sp_dag(0)
    problem = dag_problem(names, edges, work, n_devices=4, batch=8, params=1000)
    result = plan_graphpipe(problem)
    assert result.plan.replicated  # data parallelism over the stage's devices (§3.2, |D_i| > 1)
    assert result.plan.prediction is not None
    assert result.plan.prediction.iteration_s < brute_force(problem).iteration_s


def test_a_chain_model_degenerates_to_a_sequential_pipeline() -> None:
    names = [f"l{i}" for i in range(8)]
    problem = dag_problem(names, [], [1.0, 3.0, 1.0, 2.0, 2.0, 1.0, 4.0, 1.0], params=10**8, batch=16)
    plan = plan_graphpipe(problem).plan
    plan.validate(names, None)
    assert plan.stage_edges == tuple((k, k + 1) for k in range(plan.n_stages - 1))
    assert [n for s in plan.stages for n in s.layers] == names


def test_the_plan_is_deterministic() -> None:
    names, edges, work = random_sp_dag(3)
    first = plan_graphpipe(dag_problem(names, edges, work, params=10**8))
    again = plan_graphpipe(dag_problem(names, edges, work, params=10**8))
    assert first.plan == again.plan and [c.plan for c in first.candidates] == [c.plan for c in again.candidates]


def test_memory_limits_are_respected() -> None:
    names, edges = branches(2, 3)
    work = [1.0] * len(names)
    roomy = plan_graphpipe(dag_problem(names, edges, work, batch=16, saved=10**6))
    assert roomy.plan.prediction is not None
    need = max(roomy.plan.prediction.peak_memory_bytes)
    tight = dag_problem(names, edges, work, batch=16, saved=10**6, memory=need // 2)
    result = plan_graphpipe(tight)
    assert not overflows(result.plan, tight.cost.on(result.cluster))
    assert result.plan != roomy.plan and all(c.feasible for c in result.candidates)
    with pytest.raises(UserError, match="graphpipe planner found no plan that fits"):
        plan_graphpipe(dag_problem(names, edges, work, batch=16, saved=10**6, memory=1000))


def test_search_on_four_branches_of_eight_layers_is_fast() -> None:
    names, edges = branches(4, 8)
    problem = dag_problem(names, edges, [1.0 + (i % 3) for i in range(len(names))], n_devices=8, batch=32,
                          params=10**7)
    start = time.process_time()  # CPU seconds: the wall clock of a shared machine measures its load
    result = plan_graphpipe(problem)
    elapsed = time.process_time() - start
    result.plan.validate(names, None)
    assert result.plan.n_stages > 1 and any(len(result.plan.stage_predecessors(k)) > 1
                                            for k in range(result.plan.n_stages))
    assert elapsed < 3.0, f"the search took {elapsed:.2f} CPU seconds"


# ---- the reference ------------------------------------------------------------------------------------------

def test_brute_force_enumerates_convex_partitions() -> None:
    assert sum(1 for _ in set_partitions(4, 4)) == 15  # Bell(4)
    assert sum(1 for _ in set_partitions(4, 2)) == 8  # S(4,1) + S(4,2)
    reach = reachability(3, [(0, 1), (1, 2)])
    assert convex((0, 1), reach) and not convex((0, 2), reach)
    assert micro_batch_options(12) == [(12,), (6, 6), (4, 4, 4), (2,) * 6, (1,) * 12]


# ---- stage shapes: the merge folded into a branch tail, any replica count ----------------------------------

def test_the_merge_shares_a_stage_with_a_branch_tail() -> None:
    # 3 equal heavy branches and a light concat + head on 3 devices: a stage of its own for the merge
    # would leave two branches sharing a device; folded into one branch's stage, each branch gets one
    names, edges = branches(3, 2)
    work = [2.0] * 6 + [0.01, 0.01]
    problem = dag_problem(names, edges, work, n_devices=3, batch=8, params=10**8)
    plan = plan_graphpipe(problem).plan
    plan.validate(names, None)
    assert plan.n_ranks == 3 and plan.n_stages == 3
    last = plan.stages[-1]
    assert {"cat", "head"} <= set(last.layers) and any(n.startswith("t") for n in last.layers)
    where = {n: i for i, n in enumerate(names)}
    reach = reachability(len(names), [(where[a], where[b]) for a, b in edges])
    assert all(convex(tuple(sorted(where[n] for n in s.layers)), reach) for s in plan.stages)  # C1
    assert len(plan.stage_predecessors(plan.n_stages - 1)) == 2  # the other two branches feed it


def test_the_fold_may_take_only_the_tail_of_a_branch() -> None:
    # a long branch beside a short one: its last layer joins the merge, its first layers have their own stage
    names, edges = branches(2, 4)
    work = [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 0.01, 0.01]
    problem = dag_problem(names, edges, work, n_devices=4, batch=8, params=10**8)
    plan = plan_graphpipe(problem).plan
    plan.validate(names, None)
    folded = [s for s in plan.stages if "cat" in s.layers]
    assert len(folded) == 1 and any(n.startswith("t") for n in folded[0].layers)
    assert not {f"t{k}_0" for k in range(2)} & set(folded[0].layers)  # not a whole branch


def test_a_stage_may_have_any_replica_count() -> None:
    # light weights, heavy compute: data parallelism over all 3 devices (a power-of-two rule allowed 2 or 4)
    names = [f"l{i}" for i in range(4)]
    problem = dag_problem(names, [], [2.0] * 4, n_devices=3, batch=12, params=1000)
    plan = plan_graphpipe(problem).plan
    assert plan.n_ranks == 3 and any(len(s.ranks) == 3 for s in plan.stages)


# ---- pruning: the same plan with fewer simulations -----------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_pruning_keeps_the_plan(seed: int) -> None:
    names, edges, work = random_sp_dag(seed)
    problem = dag_problem(names, edges, work, n_devices=4, batch=16, params=10**7)
    pruned, full = plan_graphpipe(problem), plan_graphpipe(problem, prune=False)
    assert pruned.plan == full.plan
    assert isinstance(full.report, GraphPipeReport) and full.report.pruned == 0
    assert len(pruned.candidates) <= len(full.candidates)


def test_the_lower_bounds_hold_and_prune() -> None:
    names, edges = branches(4, 3)
    problem = dag_problem(names, edges, [1.0] * len(names), n_devices=8, batch=32, params=10**6)
    full = plan_graphpipe(problem, prune=False)
    pairs, tighter = layer_edges(problem), 0
    for c in full.candidates:
        assert c.cluster is not None
        sizes = c.plan.stages[0].forward_sizes
        assert work_floor_s(problem, sizes) <= c.iteration_s
        assert path_floor_s(problem, pairs, sizes) <= c.iteration_s
        assert stage_floor_s(c.plan, problem.cost.on(c.cluster)) <= c.iteration_s
        tighter += path_floor_s(problem, pairs, sizes) > work_floor_s(problem, sizes)
    assert tighter > 0  # few micro-batches: the longest path binds
    pruned = plan_graphpipe(problem)
    assert pruned.plan == full.plan
    assert isinstance(pruned.report, GraphPipeReport) and pruned.report.pruned > 0
    assert pruned.report.search_s > 0 and pruned.report.simulate_s > 0


def test_twin_branches_are_found_and_tried_once() -> None:
    names, edges = branches(3, 2)
    where = {n: i for i, n in enumerate(names)}
    pairs = [(where[a], where[b]) for a, b in edges]
    tree = decompose(len(names), pairs)
    same = dag_problem(names, edges, [1.0] * len(names), n_devices=3)
    est = StageEstimator(same, pairs, b=2, n_micro=4)
    assert twins(tree, est) == {(2, 3): (0, 1), (4, 5): (0, 1)}  # branches 1 and 2 repeat branch 0
    odd = dag_problem(names, edges, [1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0], n_devices=3)
    assert twins(tree, StageEstimator(odd, pairs, b=2, n_micro=4)) == {(4, 5): (0, 1)}  # branch 2 repeats 0 only
    assert search(tree, est, 3).strategies == search(tree, est, 3, prune=False).strategies


def test_twin_branches_are_solved_once_and_renumbered() -> None:
    # MMT's shape: the DP solves branch 0 and renumbers it for branches 1-3; every target's answer
    # and every strategy the search meets is the one of solving each branch on its own
    names, edges = branches(4, 3)
    problem = dag_problem(names, edges, [1.0] * len(names), n_devices=8, batch=32, params=10**7)
    pairs = layer_edges(problem)
    tree = decompose(len(names), pairs)
    est = StageEstimator(problem, pairs, b=4, n_micro=8)
    shared, alone = search(tree, est, 8), search(tree, est, 8, prune=False)
    assert shared.strategies == alone.strategies and shared.visited == alone.visited
    solver = _Solver(tree, est, max(s.worst_tps for s in shared.visited), twins(tree, est))
    solver.full(solver.root, 8, 0)
    assert len(solver.alias) == 3
    for key, s in solver.memo.items():
        v = key[0]
        if v in solver.alias and s is not None:
            layers = {i for stage, _ in s.stages for i in stage}
            assert layers <= set(solver.nodes[v].layers)  # the twin's own layers, renumbered


def test_a_series_run_that_fits_one_stage_is_that_stage() -> None:
    # the shortcut (one stage on all n devices, depth d + 1) agrees with trying every split
    names, edges = branches(3, 3)
    problem = dag_problem(names, edges, [1.0 + (i % 3) for i in range(len(names))], n_devices=6, batch=16,
                          params=10**6)
    pairs = layer_edges(problem)
    tree = decompose(len(names), pairs)
    est = StageEstimator(problem, pairs, b=2, n_micro=8)
    found = search(tree, est, 6)
    shortcuts = 0
    for target in sorted({s.worst_tps for s in found.visited}):
        solver = _Solver(tree, est, target)
        for v, node in enumerate(solver.nodes):
            if node.kind != "series":
                continue
            for h in range(2, len(node.children) + 1):
                for n in range(1, 7):
                    for d in range(3):
                        tried = solver._one_stage(v, h, n, d, -1)
                        tried = solver._folded(v, h, n, d, solver._last_child(v, h, n, d, -1, tried))
                        got = solver.run(v, h, n, d)
                        assert got == tried
                        shortcuts += got is not None and len(got.stages) == 1
    assert shortcuts > 0


def test_a_strategys_depth_is_its_longest_stage_path_beyond_the_micro_batch_count() -> None:
    # 2 micro-batches, pipelines of 3-5 stages: depths past m must not share a memo entry
    names, edges = branches(3, 3)
    names += ["top0", "top1"]
    edges += [("head", "top0"), ("top0", "top1")]
    problem = dag_problem(names, edges, [1.0] * len(names), n_devices=8, batch=8, params=10**8)
    layer_pairs = layer_edges(problem)
    tree = decompose(len(names), layer_pairs)
    found = search(tree, StageEstimator(problem, layer_pairs, b=4, n_micro=2), 8)
    assert found.strategies
    for s in found.strategies.values():
        plan, _ = to_plan(problem, layer_pairs, s.stages, (4, 4))
        longest = [1] * plan.n_stages
        for a, b in sorted(plan.stage_edges, reverse=True):
            longest[a] = max(longest[a], longest[b] + 1)
        assert s.depth == max(longest)


# ---- the DP's objective against the simulator (issue 29) -----------------------------------------------------

@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_a_data_parallel_stages_tps_is_its_simulated_iteration(replicas: int) -> None:
    # 8 micro-batches on 3 replicas: the busiest runs 3 of them, not 8/3 (12.5 % more)
    names = [f"l{i}" for i in range(4)]
    problem = dag_problem(names, [], [2.0] * 4, n_devices=4, batch=16, params=10**6)
    pairs, layers = layer_edges(problem), (0, 1, 2, 3)
    est = StageEstimator(problem, pairs, b=2, n_micro=8)
    plan, cluster = to_plan(problem, pairs, [(layers, replicas)], (2,) * 8)
    simulated = score(plan, problem.cost.on(cluster)).iteration_s
    assert est.tps(layers, replicas) * 16 == pytest.approx(simulated, rel=0.02)


def test_packed_placement_keeps_each_stage_on_one_node() -> None:
    cluster = Cluster.homogeneous("v100", 2, 4, Link(5e-6, 150e9), Link(5e-6, 12.5e9))
    assert place(cluster, [2, 4, 2], packed=False) == [(0, 1), (2, 3, 4, 5), (6, 7)]
    assert place(cluster, [2, 4, 2]) == [(4, 5), (0, 1, 2, 3), (6, 7)]
    assert place(cluster, [3, 2, 2]) == [(0, 1, 2), (4, 5), (6, 7)]
    assert place(cluster, [6, 1]) == [(0, 1, 2, 3, 4, 5), (6,)]  # too big for a node: the emptiest first


def test_the_plan_is_the_simulators_best_of_the_strategies_searched() -> None:
    # four equal branches and a merge on 8 devices, heavy weights: the search meets more strategies
    # than one per device count, and of those the planner's estimate finds the simulator's best
    names, edges = branches(4, 3)
    problem = dag_problem(names, edges, [1.0] * len(names), n_devices=8, batch=32, params=10**8)
    result = plan_graphpipe(problem, prune=False)
    b = max(result.plan.stages[0].forward_sizes)
    pairs = layer_edges(problem)
    sizes = (b,) * (32 // b)
    found = search(decompose(len(names), pairs), StageEstimator(problem, pairs, b, len(sizes)), 8)
    simulated = []
    for s in found.visited:
        plan, cluster = to_plan(problem, pairs, s.stages, sizes)
        simulated.append(score(plan, problem.cost.on(cluster)).iteration_s)
    assert len(simulated) > len(found.strategies)
    assert result.candidates[0].iteration_s <= 1.01 * min(simulated)
