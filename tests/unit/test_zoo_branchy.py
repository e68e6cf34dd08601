"""The branchy (DAG) zoo models: contract, shapes, sizes, and branchy-digits learning the digits."""

from __future__ import annotations

import pickle

import pytest
import torch

from pipetrain.data.digits import digits_pair
from pipetrain.data.sources import default_source
from pipetrain.graph.dataflow import StageModule, chain_ports
from pipetrain.graph.layer_graph import LayerGraph, LossKind, loss_sum
from pipetrain.graph.zoo import build_model
from tests.unit.dag_helpers import check_contract, inputs_of, run_dag

TINY = {  # preset -> (layers, output shape per sample)
    "mmt-tiny": (14, (10,)),
    "candle-uno-tiny": (20, (1,)),
    "dlrm-tiny": (12, (2,)),
    "branchy-digits": (8, (10,)),
}
FULL = {"mmt": (38, (1000,)), "candle-uno": (33, (1,)), "dlrm": (40, (2,))}


def sample_input(graph: LayerGraph, b: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn((b, *graph.input.shape), device=device)


def sample_target(graph: LayerGraph, b: int) -> torch.Tensor:
    if graph.target.dtype == "int64":
        assert graph.target.high is not None
        return torch.randint(0, graph.target.high, (b, *graph.target.shape))
    return torch.randn((b, *graph.target.shape))


@pytest.mark.parametrize("name", [*TINY, *FULL])
def test_graph_follows_the_dag_contract(name: str) -> None:
    graph = build_model(name)
    n_layers, _ = {**TINY, **FULL}[name]
    assert graph.name == name and len(graph) == n_layers
    check_contract(graph)
    assert graph.names[-1] == "head"
    assert len(inputs_of(graph, graph.index("concat"))) >= 2, "the branches meet at concat"
    for layer in graph.layers:
        pickle.dumps(layer.build)


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_forward_and_backward_by_the_contract(name: str) -> None:
    graph = build_model(name, seed=1)
    _, out_shape = TINY[name]
    modules = [graph.build_layer(i) for i in range(len(graph))]
    out = run_dag(graph, modules, sample_input(graph, 3))
    assert out.shape == (3, *out_shape)
    loss_sum(graph.loss, out, sample_target(graph, 3)).backward()
    for i, module in enumerate(modules):
        assert all(p.grad is not None for p in module.parameters()), graph.names[i]


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_runs_as_one_module_and_as_linearised_stages(name: str) -> None:
    graph = build_model(name, seed=2)
    assert all(graph.predecessors(i) == tuple(inputs_of(graph, i)) for i in range(len(graph)))
    assert graph.output_specs()[-1].shape == TINY[name][1]
    x = sample_input(graph, 4)
    with torch.no_grad():
        expected = run_dag(graph, [graph.build_layer(i) for i in range(len(graph))], x)
        torch.testing.assert_close(graph.build_module()(x), expected)
        out = x  # a chain plan of 3 stages: the values live at each cut travel packed
        for chunk in torch.arange(len(graph)).tensor_split(3):
            indices = chunk.tolist()
            out = StageModule(graph, indices, *chain_ports(graph, indices))(out)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", list(FULL))
def test_full_size_runs_on_meta(name: str) -> None:
    graph = build_model(name)
    _, out_shape = FULL[name]
    modules = [graph.build_layer(i, "meta") for i in range(len(graph))]
    with torch.no_grad():
        out = run_dag(graph, modules, sample_input(graph, 2, "meta"))
    assert out.shape == (2, *out_shape)


def test_paper_sizes() -> None:
    mmt = build_model("mmt")
    assert mmt.input.shape == (256, 4 * 1024)
    block = mmt.build_layer(mmt.index("b3_block7"), "meta")
    attention, ffn, norms = 4 * (1024 * 1024 + 1024), 2 * 1024 * 4096 + 4096 + 1024, 4 * 1024
    assert sum(p.numel() for p in block.parameters()) == attention + ffn + norms
    uno = build_model("candle-uno", branches=16)
    assert len(uno) == 16 * 4 + 5
    assert len(inputs_of(uno, uno.index("concat"))) == 16
    assert uno.loss is LossKind.MSE
    dlrm = build_model("dlrm", rows=1_000_000)
    table = dlrm.build_layer(dlrm.index("s6_bag"), "meta")
    assert [tuple(p.shape) for p in table.parameters()] == [(1_000_000, 64)]
    assert dlrm.input.shape == (7 * 13 + 7 * 100,)


def test_dlrm_reads_indices_stored_as_floats() -> None:
    graph = build_model("dlrm-tiny")
    bag = graph.build_layer(graph.index("s1_bag"))
    x = torch.zeros(2, *graph.input.shape)
    x[0, 2 * 8 + 4 : 2 * 8 + 8] = torch.tensor([3.0, 3.0, 7.0, 49.0])
    x[1, 2 * 8 + 4 : 2 * 8 + 8] = torch.tensor([53.0, -47.0, 7.0, 49.0])  # mod 50: 3, 3, 7, 49
    table = next(bag.parameters())
    expected = table[[3, 3, 7, 49]].sum(dim=0)
    torch.testing.assert_close(bag(x), torch.stack([expected, expected]))


def test_default_data() -> None:
    assert default_source(build_model("branchy-digits")) == "digits"
    assert {default_source(build_model(name)) for name in ("mmt-tiny", "candle-uno-tiny", "dlrm-tiny")} == {
        "synthetic"
    }


def test_branchy_digits_learns_the_digits() -> None:
    torch.manual_seed(0)
    graph = build_model("branchy-digits")
    modules = [graph.build_layer(i) for i in range(len(graph))]
    optimizer = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=1e-3)
    pair = digits_pair()
    x, y = (torch.stack(t) for t in zip(*pair.train, strict=True))
    for _ in range(3):
        for batch in torch.randperm(len(x)).split(64):
            optimizer.zero_grad()
            loss = loss_sum(graph.loss, run_dag(graph, modules, x[batch]), y[batch]) / len(batch)
            loss.backward()
            optimizer.step()
    x_eval, y_eval = (torch.stack(t) for t in zip(*pair.eval, strict=True))
    with torch.no_grad():
        accuracy = (run_dag(graph, modules, x_eval).argmax(dim=1) == y_eval).float().mean().item()
    assert accuracy >= 0.9
