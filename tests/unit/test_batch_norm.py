"""BatchNorm through profiling and planning (issue 26 §4): the profilers never run a BatchNorm on a
micro-batch it cannot train on, the planners never cut one, a plan that does is refused in one line,
and a plan with several micro-batches through a BatchNorm says so in one line."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch
from torch import nn

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.batch_norm import BatchNorms, batch_norms
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec
from pipetrain.plan.batch_norm import batch_norm_warning
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.plan.stage_graph import validate_for_graph
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.counts import candidate_counts, thinned_counts
from pipetrain.planners.graphpipe.planner import micro_batch_options
from pipetrain.planners.microbatch.uedp import plan_uedp
from pipetrain.planners.twobw import micro_batch_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.inputs import filled_below
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.per_layer import _measure_layer
from pipetrain.profile.table import Profile
from pipetrain.profile.timing import _Timer
from tests.bn_net import graph as bn_graph

FAST = {"warmup": 0, "repeats": 1}
GRAPH = bn_graph()
HEAD = GRAPH.names.index("head")


def _plan(graph: LayerGraph, batch: int, n_micro: int, n_stages: int = 2) -> Plan:
    sizes = equal_sizes(batch, n_micro)
    cut = len(graph) // 2 if n_stages == 2 else len(graph)
    groups = [graph.names[:cut], graph.names[cut:]][:n_stages]
    return Plan(graph.name, graph.fingerprint(), batch, Method.ONE_F_ONE_B,
                tuple(StagePlan(layers, (k,), sizes, sizes) for k, layers in enumerate(groups)))


def _linear_costs() -> tuple[Profile, Cluster]:
    """Seconds proportional to the samples and no cost per action: the planners' fastest plans cut
    micro-batches of one sample."""
    profile = estimate_profile(GRAPH, "v100", 8)
    layers = tuple(replace(lp, forward_s=tuple(1e-3 * b for b in lp.sizes), weight_grad_s=None, input_grad_s=None,
                           backward_s=tuple(2e-3 * b for b in lp.sizes)) for lp in profile.layers)
    return replace(profile, layers=layers), replace(api.local_cluster(2), action_overhead_s=0.0)


def _smallest(plan: Plan) -> int:
    return min(min(s.forward_sizes + s.backward_sizes) for s in plan.stages)


def test_batch_norms_are_named_as_in_the_model_and_the_flat_one_needs_two_samples() -> None:
    norms = batch_norms(GRAPH)
    assert norms == BatchNorms(modules=("stem.1", "blocks.0.1", "blocks.1.1", "head.bn"),
                               layers=("stem.1", "blocks.0.1", "blocks.1.1", "head"), single_value=("head",))
    assert norms.smallest_microbatch == 2
    assert norms.named() == "stem.1, blocks.0.1, blocks.1.1 and 1 more"
    assert set(norms.modules) <= {name for name, _ in GRAPH.build_module().named_modules()}


def test_batch_norm_on_feature_maps_trains_on_one_sample_and_plain_models_have_none() -> None:
    maps = LayerGraph.from_sequential(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Flatten(),
                                                    nn.Linear(128, 3)),
                                      input=TensorSpec((1, 8, 8)), target=TensorSpec((), "int64", high=3))
    assert batch_norms(maps) == BatchNorms(modules=("1",), layers=("1",), single_value=())
    assert batch_norms(maps).smallest_microbatch == 1
    one_by_one = LayerGraph.from_sequential(  # ResNet-18's last maps at 32×32 inputs
        nn.Sequential(nn.Conv2d(1, 2, 3, stride=8, padding=1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 3)),
        input=TensorSpec((1, 8, 8)), target=TensorSpec((), "int64", high=3))
    assert batch_norms(one_by_one).single_value == ("1",)
    plain = LayerGraph.from_sequential(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2)),
                                       input=TensorSpec((4,)), target=TensorSpec((), "int64", high=2))
    assert batch_norms(plain) == BatchNorms()


class ItemScale(nn.Module):
    """Scales by a number read out of the data (``.item()``), which the meta device cannot give."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.abs().max().item()


def test_batch_norms_after_a_layer_meta_cannot_run_count_as_needing_two() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), ItemScale(), nn.BatchNorm2d(2), nn.Flatten(),
                          nn.Linear(128, 3))
    graph = LayerGraph.from_sequential(model, input=TensorSpec((1, 8, 8)), target=TensorSpec((), "int64", high=3))
    assert batch_norms(graph) == BatchNorms(modules=("2",), layers=("2",), single_value=("2",))  # the safe side


def test_filled_below_extrapolates_within_proportional_and_flat() -> None:
    assert filled_below((1, 2, 4), (2.0, 3.0)) == (1.5, 2.0, 3.0)  # the line through 2 and 4
    assert filled_below((1, 2, 4), (2.0, 7.0)) == (1.0, 2.0, 7.0)  # steeper: no less than proportional
    assert filled_below((1, 2, 4), (2.0, 1.0)) == (2.0, 2.0, 1.0)  # falling (noise): no more than at 2
    assert filled_below((1, 2), (4.0,)) == (2.0, 4.0)  # one timed size: proportional
    assert filled_below((1, 2), (3.0, 4.0)) == (3.0, 4.0)  # nothing to fill


def test_measured_profile_times_the_flat_batch_norm_from_two_samples(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        profile = measure_profile(GRAPH, 8, **FAST)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["BatchNorm in head cannot train on 1 sample (one value per channel): profiled from 2 samples, "
                     "size 1 extrapolated"]
    assert profile.source.endswith("; size 1 extrapolated for 1 BatchNorm layer(s)")
    assert all(lp.sizes == (1, 2, 4, 8) and min(lp.forward_s + lp.backward_s) > 0 for lp in profile.layers)


def test_a_layer_is_timed_from_its_smallest_size_and_filled_below() -> None:
    """The head alone (the profile's last layer also carries the loss, timed at every size)."""
    calls: list[int] = []
    head = GRAPH.build_layer(HEAD)
    head.register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[0]))
    x = torch.randn(4, 8, 2, 2)
    timer = _Timer(torch.device("cpu"), warmup=0, repeats=1)
    profile, _ = _measure_layer("head", head, x, (1, 2, 4), timer, torch.Generator(), lambda _: None, smallest=2)
    assert 1 not in calls and {2, 4} <= set(calls)
    for times in (profile.forward_s, profile.backward_s, profile.input_grad_s, profile.weight_grad_s):
        assert times is not None and times[1] / 2 <= times[0] <= times[1]  # within proportional and flat


def test_estimated_profile_prices_the_flat_batch_norm_from_two_samples(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        profile = estimate_profile(GRAPH, "v100", 8)
    assert len(caplog.records) == 1 and "size 1 extrapolated" in caplog.records[0].getMessage()
    head = profile.layers[HEAD]
    assert head.forward_s[1] / 2 <= head.forward_s[0] <= head.forward_s[1]


def test_a_batch_of_one_through_the_flat_batch_norm_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^model 'bn-net': BatchNorm in head cannot train on 1 sample \(one value "
                                        r"per channel\); use a batch \(and profile sizes\) of at least 2$"):
        measure_profile(GRAPH, 1, **FAST)
    with pytest.raises(UserError, match=r"use a batch of at least 2$"):
        PlanningProblem(ModelRef.of(GRAPH), CostModel(estimate_profile(GRAPH, "v100", 2),
                                                      api.local_cluster(2)), batch_size=1)


def test_planners_keep_micro_batches_of_two() -> None:
    assert ModelRef.of(GRAPH).smallest_microbatch == 2
    assert candidate_counts(8, smallest=2) == [1, 2, 3, 4]
    assert thinned_counts(9) == [1, 2, 3, 5, 9] and thinned_counts(9, 2) == [1, 2, 3]
    profile, cluster = _linear_costs()
    ref = ModelRef.of(GRAPH)
    assert _smallest(api.plan(replace(ref, smallest_microbatch=1), profile, cluster, batch_size=8).plan) == 1
    for planner in ("balanced", "tidgap", "pipedream", "interleaved", "2bw"):
        assert _smallest(api.plan(ref, profile, cluster, batch_size=8, planner=planner).plan) >= 2, planner
    assert micro_batch_sizes(16, 4) == [4, 2, 1] and micro_batch_sizes(16, 4, 2) == [4, 2]
    assert micro_batch_options(6, 2) == [(6,), (3, 3), (2, 2, 2)]  # GraphPipe's, without (1,) * 6
    base = _plan(GRAPH, 8, 2)
    cost = CostModel(profile, cluster)
    assert _smallest(plan_uedp(base, cost, planner="dp")) == 1
    assert _smallest(plan_uedp(base, cost, planner="dp", smallest=2)) == 2  # the best equal plan instead
    with pytest.raises(UserError, match=r"8 micro-batches of batch 8 make some of 1; use at most 4 micro-batches$"):
        api.plan(GRAPH, profile, cluster, batch_size=8, constraints=Constraints(method=Method.GPIPE, n_micro=8))


def test_a_plan_with_one_sample_through_the_flat_batch_norm_is_refused() -> None:
    validate_for_graph(_plan(GRAPH, 8, 4), GRAPH)
    first_only = replace(_plan(GRAPH, 8, 4), stages=(
        replace(_plan(GRAPH, 8, 8).stages[0]), _plan(GRAPH, 8, 4).stages[1]))
    validate_for_graph(first_only, GRAPH)  # stage 0's BatchNorms see 8×8 maps: one sample is enough
    with pytest.raises(UserError, match=r"^stage 1 gives micro-batches of 1 sample to BatchNorm in head, which cannot "
                                        r"train on fewer than 2 \(one value per channel\); give every micro-batch at "
                                        r"least 2 samples \(fewer micro-batches, or a plan from `pipetrain plan`\)$"):
        validate_for_graph(_plan(GRAPH, 8, 8), GRAPH)


def test_the_warning_names_the_batch_norms_only_with_several_micro_batches() -> None:
    assert batch_norm_warning(_plan(GRAPH, 8, 1), GRAPH) == ""
    assert batch_norm_warning(_plan(GRAPH, 8, 4), GRAPH) == (
        "BatchNorm stem.1, blocks.0.1, blocks.1.1 and 1 more normalise each micro-batch on its own (4 per batch of 8): "
        "their statistics, and the training, differ from single-process training on the whole batch")
    plain = LayerGraph.from_sequential(nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10)),
                                       input=TensorSpec((64,)), target=TensorSpec((), "int64", high=10))
    assert batch_norm_warning(_plan(plain, 8, 4), plain) == ""
    one = LayerGraph.from_sequential(nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10)),
                                     input=TensorSpec((64,)), target=TensorSpec((), "int64", high=10))
    assert batch_norm_warning(_plan(one, 8, 2), one) == (
        "BatchNorm 1 normalises each micro-batch on its own (2 per batch of 8): its statistics, and the training, "
        "differ from single-process training on the whole batch")


def test_profiling_leaves_the_graph_unchanged() -> None:
    before = {k: v.clone() for k, v in GRAPH.build_module().state_dict().items()}
    measure_profile(GRAPH, 4, **FAST)
    after = GRAPH.build_module().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
