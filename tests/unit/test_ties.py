"""Tied weights (issue 26 §3): the graph lists them, modules of several layers re-tie them, the
cost model counts and prices them, checks refuse them where they cannot be kept equal, and saved
weights name them as the model does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.capture import capture
from pipetrain.graph.dataflow import StageModule, chain_stage, whole_model
from pipetrain.graph.layer_graph import Layer, LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.graph.ties import Tie, alias_names, find_ties, saved_by, saved_name
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile, TiedBytes
from pipetrain.runtime import TrainConfig, reference_train
from pipetrain.runtime.interp.ties import check_ties
from pipetrain.runtime.job.checkpoint import restore_stage, stage_state
from pipetrain.runtime.job.data import make_batch
from pipetrain.runtime.job.optim import clip_grad_norm_global
from pipetrain.schedule.action import ActionKind
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from tests.conftest import flat_profile
from tests.gloo.models import TiedLM, tied_lm_graph

GRAPH = tied_lm_graph()  # wte, blocks.0, blocks.1, blocks.2, lm_head
EMBEDDING = Tie(("wte.weight", "lm_head.weight"), ("wte", "lm_head"))
BLOCKS = Tie(("blocks.0.weight", "blocks.1.weight"), ("blocks.0", "blocks.1"))


def weight(module: nn.Module, path: str) -> torch.Tensor:
    """The weight of ``module``'s submodule at ``path`` (captured layers keep the model's paths)."""
    found = module.get_submodule(path).weight
    assert isinstance(found, torch.Tensor)
    return found


def test_capture_lists_each_tie_with_its_names_and_layers() -> None:
    assert GRAPH.ties == (EMBEDDING, BLOCKS)
    assert EMBEDDING.name == "wte.weight"


def test_the_fingerprint_tells_a_tied_model_from_its_untied_twin() -> None:
    """Same layers, names and shapes; only the ties differ."""
    untied = TiedLM()
    untied.lm_head.weight = nn.Parameter(untied.wte.weight.detach().clone())
    untied.blocks[1].weight = nn.Parameter(untied.blocks[0].weight.detach().clone())
    twin = capture(untied, input=GRAPH.input, target=GRAPH.target, loss=LossKind.LM, name="tied-lm")
    assert twin.ties == () and twin.names == GRAPH.names
    assert twin.fingerprint() != GRAPH.fingerprint()


def test_the_whole_model_holds_each_tie_once() -> None:
    model = whole_model(GRAPH)
    assert weight(model, "4.lm_head") is weight(model, "0.wte")
    assert weight(model, "2.blocks.1") is weight(model, "1.blocks.0")
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == sum(p.numel() for p in TiedLM().parameters())  # as the module itself


def test_a_stage_holds_one_copy_and_another_stage_its_own_equal_copy() -> None:
    first, last = chain_stage(GRAPH, [0, 1, 2]), chain_stage(GRAPH, [3, 4])
    assert weight(first, "2.blocks.1") is weight(first, "1.blocks.0")
    assert weight(last, "1.lm_head") is not weight(first, "0.wte")
    assert torch.equal(weight(last, "1.lm_head"), weight(first, "0.wte"))
    both = StageModule(GRAPH, [0, 4], [(-1,), (3,)], [(0,), (4,)])  # a DAG stage re-ties as well
    assert weight(both, "1.lm_head") is weight(both, "0.wte")
    moved = chain_stage(GRAPH, range(5), device="meta")  # a move to another device keeps the ties
    assert weight(moved, "4.lm_head") is weight(moved, "0.wte") and weight(moved, "0.wte").is_meta


def test_single_process_reference_equals_plain_torch_on_the_module() -> None:
    config = TrainConfig(steps=3, optimizer="adam", lr=1e-2, progress=False)
    result = reference_train(GRAPH, 6, config)
    module = GRAPH.build_module()
    optimizer = config.build_optimizer(module.parameters())
    for step in range(3):
        x, y = make_batch(GRAPH, 6, step, config.seed, config.data)
        (loss_sum(GRAPH.loss, module(x), y) / 6).backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = module.state_dict()
    assert set(result.state_dict) == set(expected)
    for key, value in expected.items():
        assert torch.allclose(result.state_dict[key], value, atol=1e-6), key
    assert result.state_dict["lm_head.weight"] is result.state_dict["wte.weight"]


def test_from_sequential_and_from_layers_find_ties_among_given_modules() -> None:
    embed, head = nn.Embedding(7, 4), nn.Linear(4, 7, bias=False)
    head.weight = embed.weight
    spec = TensorSpec((3,), "int64", high=7)
    graph = LayerGraph.from_sequential(nn.Sequential(embed, nn.Tanh(), head), input=spec, target=spec,
                                       loss=LossKind.LM)
    assert graph.ties == (Tie(("0.weight", "2.weight"), ("0", "2")),)
    model = graph.build_sequential()
    assert model[2].weight is model[0].weight
    whole = graph.build_module()
    assert isinstance(whole, nn.Sequential) and whole[2].weight is whole[0].weight
    layers = LayerGraph.from_layers([("embed", embed), ("act", nn.Tanh), ("head", head)], input=spec, target=spec,
                                    loss=LossKind.LM)
    assert layers.ties == (Tie(("embed.weight", "head.weight"), ("embed", "head")),)
    factories = LayerGraph.from_layers([("embed", embed), ("head", lambda: head)], input=spec, target=spec)
    assert factories.ties == ()  # a factory is not looked into


def test_a_tie_must_name_two_layers_of_the_model() -> None:
    spec = TensorSpec((3,))
    layers = (Layer("a", nn.Identity), Layer("b", nn.Identity))
    with pytest.raises(UserError, match=r"a tie names layers \['c'\]; list each tied tensor") as error:
        LayerGraph("m", layers, spec, spec, ties=(Tie(("a.w", "c.w"), ("a", "c")),))
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match="fewer than 2"):
        LayerGraph("m", layers, spec, spec, ties=(Tie(("a.w",), ("a",)),))


def test_find_ties_ignores_tensors_of_one_layer() -> None:
    inner = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    inner[1].weight = inner[0].weight
    assert find_ties([(Layer("x", nn.Identity), inner), (Layer("y", nn.Identity), nn.Linear(3, 3))]) == ()


def test_names_a_tie_is_saved_and_returned_under() -> None:
    ties = (EMBEDDING,)
    assert saved_name("lm_head.weight", ties) == "wte.weight" and saved_name("blocks.0.bias", ties) == "blocks.0.bias"
    assert saved_by("wte", "wte.weight", ties) and not saved_by("lm_head", "lm_head.weight", ties)
    assert not saved_by("lm_head", "wte.weight", ties)  # the same name in a later layer: saved by the first only
    value = torch.ones(2)
    state = alias_names({"wte.weight": value, "lm_head.weight": value.clone(), "x": torch.zeros(1)}, ties)
    assert state["lm_head.weight"] is state["wte.weight"] is value and set(state) == {"wte.weight", "lm_head.weight",
                                                                                        "x"}
    with pytest.raises(RuntimeError, match=r"copies of tied wte\.weight differ from lm_head\.weight"):
        alias_names({"wte.weight": value, "lm_head.weight": value + 1}, ties)


def test_a_stage_checkpoint_writes_a_tie_once_and_loads_it_into_every_copy() -> None:
    first, last = chain_stage(GRAPH, [0, 1, 2]), chain_stage(GRAPH, [3, 4])
    optimizer = torch.optim.Adam(first.parameters())
    for p in first.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    layers = GRAPH.layers_named(["wte", "blocks.0", "blocks.1"])
    state = stage_state(first, layers, optimizer, owner=True, ties=GRAPH.ties)
    assert "blocks.1.weight" not in state["model"] and "wte.weight" in state["model"]
    assert {k for k in state["optimizer"] if k.startswith("blocks.")} == {
        f"blocks.{i}.{p}/{key}" for i, p in [(0, "weight"), (0, "bias"), (1, "bias")]
        for key in ("step", "exp_avg", "exp_avg_sq")}
    last_state = stage_state(last, GRAPH.layers_named(["blocks.2", "lm_head"]), None, owner=True, ties=GRAPH.ties)
    assert set(last_state["model"]) == {"blocks.2.weight", "blocks.2.bias"}  # the head's copy is not written

    fresh_first, fresh_last = chain_stage(GRAPH, [0, 1, 2]), chain_stage(GRAPH, [3, 4])
    fresh_optimizer = torch.optim.Adam(fresh_first.parameters())
    merged = {"model": {**state["model"], **last_state["model"]}, "optimizer": state["optimizer"], "rng": {}}
    restore_stage(merged, fresh_first, layers, fresh_optimizer, GRAPH.ties)
    restore_stage(merged, fresh_last, GRAPH.layers_named(["blocks.2", "lm_head"]), None, GRAPH.ties)
    assert weight(fresh_first, "2.blocks.1") is weight(fresh_first, "1.blocks.0")  # still one tensor
    assert torch.equal(weight(fresh_first, "1.blocks.0"), weight(first, "1.blocks.0"))
    assert torch.equal(weight(fresh_last, "1.lm_head"), weight(first, "0.wte"))
    restored = fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(restored[i]["exp_avg"], entry["exp_avg"])
               for i, entry in optimizer.state_dict()["state"].items())


def _plan(stages: list[tuple[str, ...]], ranks: list[tuple[int, ...]], method: Method) -> Plan:
    return Plan("tied-lm", "", 4, method, tuple(StagePlan(s, r, (2, 2), (2, 2)) for s, r in zip(stages, ranks,
                                                                                             strict=True)))


ACROSS = [("wte", "blocks.0", "blocks.1"), ("blocks.2", "lm_head")]


@pytest.mark.parametrize("method", [Method.TWO_BW, Method.LOCAL])
def test_methods_that_cannot_sum_a_tie_across_stages_refuse_it_in_one_line(method: Method) -> None:
    with pytest.raises(UserError, match=r"wte.weight is tied to lm_head.weight \(layers wte, lm_head\) on stages "
                                        rf"\[0, 1\], which method {method.value} cannot keep equal; put those "
                                        "layers in one stage, or use a synchronous method") as error:
        check_ties(GRAPH, _plan(ACROSS, [(0,), (1,)], method))
    assert "\n" not in str(error.value)
    check_ties(GRAPH, _plan([GRAPH.names], [(0,)], method))  # one stage: nothing to sum
    check_ties(GRAPH, _plan(ACROSS, [(0,), (1,)], Method.ONE_F_ONE_B))


def test_clipping_counts_a_tied_copy_once() -> None:
    """Rank view: a tied parameter held by 2 copies (same summed gradient) adds half its square each."""
    tied, own = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(1))
    tied.grad, own.grad = torch.full((4,), 2.0), torch.tensor([3.0])  # ‖·‖² = 16 and 9
    total = clip_grad_norm_global([tied, own], 1e9, world=None, copies={id(tied): 2})
    assert total == pytest.approx((16 / 2 + 9) ** 0.5)
    assert clip_grad_norm_global([tied, own], 1e9, world=None, replicas=3, copies={id(tied): 2}) == pytest.approx(
        (16 / 2 + 9 / 3) ** 0.5)


def test_profiles_record_tied_bytes_and_read_them_back() -> None:
    profile = estimate_profile(GRAPH, "a100", 4)
    width, vocab = 8, 11
    assert profile.ties == (TiedBytes(("wte", "lm_head"), vocab * width * 4),
                            TiedBytes(("blocks.0", "blocks.1"), width * width * 4))
    assert Profile.from_json(profile.to_json()) == profile
    cost = CostModel(profile, Cluster.local(2))
    each = {lp.name: lp.parameter_bytes for lp in profile.layers}
    assert each["lm_head"] == vocab * width * 4  # the layer counts its copy
    assert cost.parameter_bytes(GRAPH.names) == sum(p.numel() * 4 for p in TiedLM().parameters())  # once
    assert cost.parameter_bytes(["blocks.2", "lm_head"]) == each["blocks.2"] + each["lm_head"]  # its own copy


def test_the_simulator_prices_the_ties_all_reduce_at_each_owners_first_step() -> None:
    names = ("l0", "l1", "l2", "l3")
    untied = flat_profile(4, parameter_bytes=10_000, step_s=0.01)
    tied = replace(untied, ties=(TiedBytes(("l0", "l3"), 10_000),))
    cluster = Cluster.local(2)
    across = _plan([names[:2], names[2:]], [(0,), (1,)], Method.ONE_F_ONE_B)
    price = CostModel(tied, cluster).allreduce_s(10_000, [0, 1])
    assert price > 0

    def steps(profile: Profile, plan: Plan) -> dict[int, float]:
        timeline = simulate(build_schedule(plan), plan, CostModel(profile, cluster))
        return {e.rank: e.end_s - e.start_s for e in timeline.events if e.action.kind is ActionKind.STEP}

    plain, priced = steps(untied, across), steps(tied, across)
    assert priced == pytest.approx({r: plain[r] + price for r in plain})
    assert CostModel(tied, cluster).tied_allreduce_s([(s.layers, s.ranks) for s in across.stages], 1) == price
    v_placement = [(names[:1], (0,)), (names[1:3], (1,)), (names[3:], (0,))]  # both users on rank 0
    assert CostModel(tied, cluster).tied_allreduce_s(v_placement, 0) == 0.0


def test_replicas_all_reduce_their_untied_parameters_and_the_owners_the_tie() -> None:
    tied = replace(flat_profile(4, parameter_bytes=10_000), ties=(TiedBytes(("l0", "l3"), 10_000),))
    cost = CostModel(tied, Cluster.local(3))
    stages = [(("l0", "l1"), (0, 1)), (("l2", "l3"), (2,))]
    assert cost.replica_bytes(stages, 0) == 10_000 and cost.replica_bytes(stages, 1) == 10_000
    assert cost.tied_allreduce_s(stages, 2) == cost.allreduce_s(10_000, [0, 1, 2]) > 0
    assert cost.replica_bytes([(("l0", "l1", "l2", "l3"), (0, 1))], 0) == 30_000  # one stage: tied once, all-reduced


class Scaled(nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_persistent_buffer_two_layers_hold_is_tied_as_well() -> None:
    scale = torch.full((3,), 2.0)
    spec = TensorSpec((3,))
    graph = LayerGraph.from_layers([("a", Scaled(scale)), ("b", Scaled(scale))], input=spec, target=spec,
                                   loss=LossKind.MSE)
    assert graph.ties == (Tie(("a.scale", "b.scale"), ("a", "b")),)
    model = graph.build_sequential()
    assert model[1].scale is model[0].scale
    assert estimate_profile(graph, "a100", 2).ties == ()  # no gradient to sum, nothing to price
