"""PipeDream's DP as a runnable plan, ``--planner auto``, and the CLI's cluster planners."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain import cli
from pipetrain.cluster import Cluster, Link
from pipetrain.cluster_spec import load_cluster_spec
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.methods import Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.planners.auto import ASYNC_NOTE, INTERLEAVED_GA_MAX_BATCH, AutoReport, plan_auto
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.interleaved import plan_interleaved
from pipetrain.planners.microbatch import GAConfig
from pipetrain.planners.partition.pipedream import pipedream_partition
from pipetrain.planners.pipedream import PipeDreamReport, plan_pipedream, topology
from pipetrain.planners.registry import ASYNC_AUTO_PLANNERS, AUTO_PLANNERS, AUTO_RUNS, auto_planners
from pipetrain.schedule.generators import build_schedule
from pipetrain.viz.plan_tables import auto_table
from tests.conftest import flat_profile

NVLINK, ETHERNET = Link(5e-6, 1.5e11), Link(2e-5, 3e9)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"


def vgg_like() -> CostModel:
    """Eight compute-heavy, weight-light layers, then two with weights whose sync costs far more than their
    compute, on 4 devices in one server (1 GB/s links, memory no object)."""
    profile = flat_profile(10, [1.0] * 8 + [0.05] * 2, [2.0] * 8 + [0.1] * 2, output_bytes=1000)
    layers = tuple(lp if i < 8 else type(lp)(**{**lp.__dict__, "parameter_bytes": 10**12})
                   for i, lp in enumerate(profile.layers))
    cluster = Cluster.local(4, link=Link(5e-6, 1e9), memory_bytes=1 << 50)
    return CostModel(type(profile)(**{**profile.__dict__, "layers": layers}), cluster)


def test_pipedream_replicates_the_compute_heavy_front() -> None:
    cost = vgg_like()
    result = plan_pipedream(PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), cost, batch_size=16))
    build_schedule(result.plan)  # validates
    assert isinstance(result.report, PipeDreamReport)
    assert result.report.config.split("-")[0] != "1" and len(result.plan.stages[0].ranks) > 1
    assert len(result.plan.stages[-1].ranks) == 1  # the weight-heavy layers are not replicated
    assert result.plan.prediction is not None
    assert result.candidates[0].plan == result.plan


@pytest.mark.parametrize("method", [None, Method.PIPEDREAM])
def test_straight_never_replicates(method: Method | None) -> None:
    """``straight``: PipeDream's straight pipeline, no stage replicated, data parallelism included."""
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), vgg_like(), batch_size=16,
                              constraints=Constraints(method=method))
    result = plan_pipedream(problem, counts=[4, 8], straight=True)
    assert result.candidates and all(not c.plan.replicated for c in result.candidates)


def test_topology_follows_the_servers() -> None:
    two_servers = Cluster.homogeneous("v100", 2, 4, NVLINK, ETHERNET)
    assert [(lv.machines, lv.bandwidth_bytes_per_s) for lv in topology(two_servers)] == [(4, 1.5e11), (2, 3e9)]
    assert [lv.machines for lv in topology(Cluster.local(3, link=NVLINK))] == [3]


def test_auto_runs_every_planner_and_keeps_the_fastest() -> None:
    cost = vgg_like()
    result = plan_auto(PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), cost, batch_size=16),
                       AUTO_RUNS)
    assert isinstance(result.report, AutoReport)
    assert [o.planner for o in result.report.outcomes] == [p for p in AUTO_PLANNERS if p != "graphpipe"]  # a chain
    found = [o for o in result.report.outcomes if o.plan is not None]
    assert result.plan.prediction is not None
    # the fastest, to 3 significant digits (rank_key: closer ties go to less memory, fewer micro-batches)
    assert result.plan.prediction.iteration_s <= min(o.iteration_s for o in found) * 1.001
    assert result.report.winner in {o.planner for o in found}


@pytest.mark.parametrize("planner", ["pipedream", "bapipe", "auto"])
def test_cli_plans_on_a_cluster_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str], planner: str) -> None:
    out = tmp_path / "plan.json"
    code = cli.main(["plan", "--model", "gpt-tiny", "--batch", "16", "--cluster", str(EXAMPLES / "2x4-v100.yaml"),
                     "--planner", planner, "--out", str(out)])
    assert code == 0
    plan = Plan.from_json(out.read_text())
    assert json.loads(out.read_text())["prediction"]["iteration_s"] > 0
    build_schedule(plan)
    shown = capsys.readouterr().out
    assert "predicted iteration" in shown
    assert plan.measurements is not None and plan.measurements.cluster is not None
    assert plan.measurements.cluster.endswith("2x4-v100.yaml")  # the spec, recorded by its path
    # simulate reuses it (idle devices included: the plan's ranks are its first ones)
    assert cli.main(["simulate", "--plan", str(out), "--out-dir", str(tmp_path / "sim")]) == 0


def test_cli_refuses_a_method_with_a_cluster_planner(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--model", "gpt-tiny", "--planner", "pipedream", "--method", "gpipe",
                     "--estimate", "v100"])
    err = capsys.readouterr().err
    assert code == 2 and "pipedream chooses --method itself" in err and "drop --method" in err


def test_pipedream_method_plans_the_steady_state_dp_run_asynchronously() -> None:
    """``--method pipedream --planner pipedream``: the DP's own objective (no flush), run by pipedream
    under 1F1B-RR's rules (micro-batches a multiple of every replica count)."""
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), vgg_like(), batch_size=16,
                              constraints=Constraints(method=Method.PIPEDREAM))
    result = plan_pipedream(problem)
    assert isinstance(result.report, PipeDreamReport)
    for c in result.candidates:
        assert c.plan.method is Method.PIPEDREAM and c.plan.weights is WeightPolicy.STASH
        assert all(len(c.plan.stages[0].forward_sizes) % len(s.ranks) == 0 for s in c.plan.stages)
        assert c.plan.prediction is not None and "steady state" in c.plan.prediction.basis
    replicated = [c.plan for c in result.candidates if c.plan.replicated]
    assert replicated and len(replicated[0].stages[0].ranks) == 3  # the DP's 3-1 where 3 divides the count
    assert any("3 replicas do not divide 16" in why for _, why in result.report.skipped)
    build_schedule(replicated[0], 4)  # validates the versions and chunks


def test_pipedream_method_returns_data_parallelism_where_it_is_fastest() -> None:
    """Per-sample compute, small weights and activations dear to send (ResNet-50's shape on the paper's
    clusters): every device running every layer, one all-reduce per step, beats any pipeline, and the
    asynchronous planner returns it as PipeDream's config "4" (one stage on all 4 ranks), runnable."""
    profile = flat_profile(10, 1.0, 2.0, per_sample=True, output_bytes=10**8, parameter_bytes=1000)
    cost = CostModel(profile, Cluster.local(4, link=Link(5e-6, 1e9), memory_bytes=1 << 50))
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), cost, batch_size=16,
                              constraints=Constraints(method=Method.PIPEDREAM))
    result = plan_pipedream(problem, counts=[4, 8, 16])
    assert isinstance(result.report, PipeDreamReport) and result.report.config == "4"
    assert result.plan.method is Method.PIPEDREAM and result.plan.n_stages == 1
    assert result.plan.stages[0].ranks == (0, 1, 2, 3)
    assert len(result.plan.stages[0].forward_sizes) % 4 == 0
    pipelines = [c for c in result.candidates if c.plan.n_stages > 1]
    assert pipelines and min(c.iteration_s for c in pipelines) > result.candidates[0].iteration_s
    build_schedule(result.plan, 4)  # validates: a replicated (last) stage under 1F1B-RR


def test_fifteen_one_is_reachable_on_cluster_a() -> None:
    """PipeDream's VGG-16 answer on cluster A (4 servers of 4) is "15-1". The hierarchy's stages come in
    whole servers' worth (its answer here is "12-4"), so the asynchronous planner also runs the DP flat
    (one level over the inter-node link), reaches 15-1 and, simulated fastest, returns it."""
    cluster_a = load_cluster_spec(EXAMPLES / "pipedream-a.yaml").cluster
    assert [lv.machines for lv in topology(cluster_a)] == [4, 4] and [lv.machines for lv in
                                                                     topology(cluster_a, flat=True)] == [16]
    mb = 10**6
    vgg = ([1.0] * 8 + [0.2] * 2, [mb] * 8 + [0.01 * mb] * 2, [mb] * 8 + [400 * mb] * 2)
    assert pipedream_partition(*vgg, topology(cluster_a)).config == "12-4"
    assert pipedream_partition(*vgg, topology(cluster_a, flat=True)).config == "15-1"
    profile = flat_profile(10, [0.01] * 8 + [0.002] * 2, [0.02] * 8 + [0.004] * 2, per_sample=True,
                           output_bytes=mb)
    layers = tuple(lp if i < 8 else replace(lp, parameter_bytes=400 * mb) for i, lp in enumerate(profile.layers))
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]),
                              CostModel(replace(profile, layers=layers), cluster_a), batch_size=60,
                              constraints=Constraints(method=Method.PIPEDREAM))
    result = plan_pipedream(problem, counts=[15])
    assert isinstance(result.report, PipeDreamReport) and result.report.config == "15-1"
    assert [len(s.ranks) for s in result.plan.stages] == [15, 1]
    build_schedule(result.plan, 2)  # validates


def test_pipedream_planner_refuses_other_async_methods() -> None:
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), vgg_like(), batch_size=16,
                              constraints=Constraints(method=Method.TWO_BW))
    with pytest.raises(UserError, match="plans gpipe, 1f1b or pipedream"):
        plan_pipedream(problem)


def test_cli_plans_pipedream_with_its_planner(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "gpt-tiny", "--batch", "16", "--estimate", "v100", "--ranks", "4",
                     "--planner", "pipedream", "--method", "pipedream", "--out", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert plan.method is Method.PIPEDREAM and plan.prediction is not None
    assert "steady state" in plan.prediction.basis


@pytest.mark.parametrize("allow", [False, True])
def test_auto_considers_async_methods_only_when_allowed(allow: bool) -> None:
    problem = PlanningProblem(ModelRef.synthetic([f"l{i}" for i in range(10)]), vgg_like(), batch_size=16,
                              constraints=Constraints(allow_async=allow))
    result = plan_auto(problem, AUTO_RUNS)
    assert isinstance(result.report, AutoReport)
    names = [o.planner for o in result.report.outcomes]
    assert names == list(auto_planners(problem)) == [*AUTO_PLANNERS[:-1], *(ASYNC_AUTO_PLANNERS if allow else ())]
    methods = {c.plan.method for c in result.candidates}
    assert bool(methods & {Method.PIPEDREAM, Method.TWO_BW}) == allow
    table = auto_table(result, width=220)
    assert (ASYNC_NOTE in table) == allow
    assert all(o.asynchronous == (o.planner in ASYNC_AUTO_PLANNERS) for o in result.report.outcomes)


def test_auto_runs_interleaved_ga_for_small_batches_or_a_given_budget() -> None:
    """interleaved-ga, auto's costliest planner, runs for a batch up to INTERLEAVED_GA_MAX_BATCH, or
    for any batch when a GA budget asks for the search; it starts from the interleaved planner's
    fastest fused plan, so its plan keeps those stages."""
    model = ModelRef.synthetic([f"l{i}" for i in range(10)])

    def names(batch: int, constraints: Constraints | None = None) -> tuple[str, ...]:
        return auto_planners(PlanningProblem(model, vgg_like(), batch_size=batch,
                                             constraints=constraints or Constraints()))

    assert "interleaved-ga" in names(INTERLEAVED_GA_MAX_BATCH)
    assert "interleaved-ga" not in names(INTERLEAVED_GA_MAX_BATCH + 1)
    assert "interleaved-ga" in names(INTERLEAVED_GA_MAX_BATCH + 1, Constraints(ga=GAConfig(8, 3)))
    result = plan_auto(PlanningProblem(model, vgg_like(), batch_size=8, constraints=Constraints(ga=GAConfig(8, 3))),
                       AUTO_RUNS)
    assert isinstance(result.report, AutoReport)
    outcome = {o.planner: o for o in result.report.outcomes}["interleaved-ga"]
    fused = next(c.plan for c in plan_interleaved(PlanningProblem(model, vgg_like(), batch_size=8)).candidates
                 if c.plan.method is Method.INTERLEAVED)
    assert outcome.plan is not None and outcome.plan.method is Method.INTERLEAVED, outcome.note
    assert [s.layers for s in outcome.plan.stages] == [s.layers for s in fused.stages]
    outcome.plan.validate(model.layer_names, "")


def test_cli_auto_takes_a_ga_budget(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "gpt-tiny", "--batch", "16", "--estimate", "v100", "--ranks", "2",
                     "--planner", "auto", "--population", "8", "--generations", "3", "--out", str(out)]) == 0
    assert Plan.from_json(out.read_text()).prediction is not None


def test_cli_allow_async_is_for_auto(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--model", "gpt-tiny", "--planner", "balanced", "--allow-async", "--estimate", "v100"])
    assert code == 2 and "--allow-async" in capsys.readouterr().err


def test_a_probed_all_reduce_prices_the_dp_sync_inside_a_server() -> None:
    """Layers of 1 s and 3 s per item with 10 MB of weights: on a fast link replicating the whole model
    wins (2 s per item); when the probe measured the all-reduce 10⁴× slower than the link
    (``Cluster.collective``), the pipeline does (3 s per item)."""
    from pipetrain.planners.partition.pipedream import Level, pipedream_partition

    fast = Level(2, 1e10, 1e-6)
    slow_sync = Level(2, 1e10, 1e-6, sync=(1e-4, 1e6))
    args = ([1.0, 3.0], [1e3, 1e3], [1e7, 1e7])
    assert pipedream_partition(*args, [fast]).config == "2"
    assert pipedream_partition(*args, [slow_sync]).config == "1-1"
    cluster = Cluster.local(2, link=Link(1e-6, 1e10), collective=Link(1e-4, 1e6))
    assert topology(cluster) == [slow_sync]
    assert topology(Cluster.local(2, link=Link(1e-6, 1e10))) == [fast]
