"""Any nn.Module captured with torch.fx into a LayerGraph (issue 12 §1), and models by reference.

Layer grouping, packing of several tensors across a cut, state-dict names, errors of one line,
pickling (also into a spawned process), ``load_model`` and ``api.resolve_model`` with user models.
"""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from pipetrain import api
from pipetrain.data import data_specs
from pipetrain.errors import UserError
from pipetrain.graph.capture import capture
from pipetrain.graph.dataflow import whole_model
from pipetrain.graph.layer_graph import Field, LayerGraph, LossKind, TensorSpec
from pipetrain.graph.load import capture_module, load_model
from pipetrain.graph.ties import Tie
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan
from pipetrain.runtime.interp.rank_setup import stage_specs

VEC = TensorSpec((6,))
CLASS = TensorSpec((), "int64", high=3)


def grab(module: nn.Module, name: str = "m", **kwargs: object) -> LayerGraph:
    return capture(module, input=VEC, target=CLASS, loss=LossKind.CROSS_ENTROPY, name=name, **kwargs)  # type: ignore[arg-type]


def qualified_state(graph: LayerGraph) -> dict[str, torch.Tensor]:
    """Every layer's built state under the model's names; asserts that no name repeats."""
    state: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(graph.layers):
        for key, value in graph.build_layer(i).state_dict().items():
            assert layer.qualified(key) not in state
            state[layer.qualified(key)] = value
    return state


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.norm(x)))


class Residual(nn.Module):
    """stem → 3 × (x = x + block(x)) → head, with a root buffer, a BatchNorm and an unused module."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.blocks = nn.ModuleList(Block(8) for _ in range(3))
        self.act = nn.ReLU()  # stateless: runs with its neighbours
        self.head = nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("mask", torch.ones(8), persistent=False)
        self.spare = nn.Linear(2, 2)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn(self.stem(x)))
        for block in self.blocks:
            x = x + block(x) * self.mask
        return self.head(x) * self.scale


class Skip(nn.Module):
    """The stem's output ``h`` skips ``a`` and ``b``: the cut between them carries ``h`` and ``a``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(8, 5), nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.stem(x)
        if mask is not None:
            h = h * mask
        return self.head(h + self.b(torch.tanh(self.a(h))))


class Attention(nn.Module):
    """A pre-norm transformer block; nn.MultiheadAttention is a torch.nn module, so a leaf."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Tokens ``[b, 5]`` int64 → embedding + positions → 2 blocks → logits ``[b, 5, 11]``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.positions = nn.Parameter(torch.randn(5, 8))
        self.blocks = nn.ModuleList(Attention(8) for _ in range(2))
        self.head = nn.Linear(8, 11)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# ---- grouping and forward --------------------------------------------------------------------


def test_residual_module_groups_by_owner_and_keeps_each_add_with_its_block() -> None:
    model = Residual()
    graph = grab(model)
    assert graph.names == ("stem", "bn", "blocks.0", "blocks.1", "blocks.2", "head")
    assert all(layer.prefix == "" for layer in graph.layers)
    model.eval()
    x = torch.randn(4, 6)
    chain = graph.build_sequential().eval()
    assert torch.equal(chain(x), model(x))
    head = graph.build_layer(len(graph) - 1, device="meta")  # its root buffer `scale` moves along
    assert head(torch.empty(2, 8, device="meta")).shape == (2, 3)


def test_transformer_blocks_in_a_module_list() -> None:
    model = TinyGPT()
    graph = capture(model, input=TensorSpec((5,), "int64", high=11), target=TensorSpec((5,), "int64", high=11),
                    loss=LossKind.LM, name="gpt")
    assert graph.names == ("embed", "blocks.0", "blocks.1", "head")
    tokens = torch.randint(0, 11, (3, 5))
    assert torch.equal(graph.build_sequential()(tokens), model(tokens))
    assert "blocks.1.attn.in_proj_weight" in qualified_state(graph)


def test_a_skip_makes_a_dag_whose_linearised_cut_packs_two_tensors_and_gradients_flow() -> None:
    model = Skip()
    graph = grab(model)
    assert graph.names == ("stem", "a", "b", "head")
    assert graph.edges == (("stem", "a"), ("stem", "b"), ("a", "b"), ("b", "head"))  # b reads h and a's output
    assert graph.output_specs()[1] == TensorSpec((5,))
    assert stage_specs(graph, [0, 1])[1] == TensorSpec((8 + 5,))  # a chain plan's cut after a carries h beside a
    x = torch.randn(4, 6)
    whole = whole_model(graph)
    out = whole(x)
    assert torch.equal(out, model(x))
    out.square().sum().backward()
    model(x).square().sum().backward()
    grads = {layer.qualified(k): p.grad for layer, child in zip(graph.layers, whole.children(), strict=True)
             for k, p in child.named_parameters()}
    assert all(torch.allclose(grads[k], p.grad, atol=1e-6) for k, p in model.named_parameters())  # type: ignore[arg-type]


class Towers(nn.Module):
    """Two towers on the input, concatenated: ``b`` and the merge run after tower ``a``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8))
        self.b, self.head = nn.Linear(6, 4), nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.a(x), self.b(x)], dim=-1))


def test_towers_capture_as_a_dag_with_the_input_passed_along() -> None:
    """``b`` reads the input and tower ``a``'s output (the concatenation runs with it), so the input
    reaches it through the first layer, the one layer that reads the model input."""
    model = Towers()
    graph = grab(model)
    assert not graph.is_chain and graph.names == ("a.0", "a.2", "b", "head")  # the ReLU a.1 runs with a.0
    assert ("a.0", "b") in graph.edges and ("a.2", "b") in graph.edges
    x = torch.randn(5, 6)
    assert torch.allclose(graph.build_module()(x), model(x))


def test_state_dict_union_is_the_modules_key_for_key() -> None:
    model = Residual()
    state = qualified_state(grab(model))
    expected = model.state_dict()
    assert list(state) != [] and set(state) == set(expected)  # BatchNorm stats and the unused module too
    assert "mask" not in state and "bn.num_batches_tracked" in state
    assert all(torch.equal(state[k], v) for k, v in expected.items())


def test_a_sequential_splits_like_any_container_and_activations_join_the_layer_before() -> None:
    """Each entry a layer, a nested Sequential's entries too; the ReLU and Tanh hold no state, so
    they run with the Linear before them (no layer of an activation alone)."""
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3))
    graph = grab(model)
    assert graph.names == ("0", "2.0", "3")
    assert set(qualified_state(graph)) == set(model.state_dict())
    x = torch.randn(5, 6)
    assert torch.equal(graph.build_sequential()(x), model(x))


def test_capture_is_a_snapshot_and_layers_are_fresh_copies() -> None:
    model = Skip()
    graph = grab(model)
    before = model.stem.weight.detach().clone()
    with torch.no_grad():
        model.stem.weight.add_(1.0)
    first, second = graph.build_layer(0), graph.build_layer(0)
    assert torch.equal(first.state_dict()["stem.weight"], before)
    assert first.state_dict()["stem.weight"].data_ptr() != second.state_dict()["stem.weight"].data_ptr()


def test_fingerprint_ignores_the_name_and_sees_the_input() -> None:
    assert grab(Skip(), "one").fingerprint() == grab(Skip(), "two").fingerprint()
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    flat, square = (capture(model, input=TensorSpec(shape), target=CLASS, loss=LossKind.CROSS_ENTROPY, name="m")
                    for shape in [(12,), (2, 6)])
    assert flat.fingerprint() != square.fingerprint()


# ---- errors ----------------------------------------------------------------------------------


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([BranchyBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner[0](x)


class BranchyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 3), nn.Linear(6, 6)
        self.c.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.c(torch.relu(self.a(x))))


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.b(self.a(x)))


class IntBeside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signs = (x > 0).long()
        return self.b(self.a(x)) + signs


def test_values_of_several_dtypes_cross_a_cut_in_one_tensor_and_gradients_flow() -> None:
    model = IntBeside()
    graph = grab(model)
    assert graph.names == ("a", "b")
    first, second = graph.build_layer(0), graph.build_layer(1)
    x = torch.randn(4, 6, requires_grad=True)
    packed = first(x)
    assert packed.dtype == torch.float32 and packed.shape == (4, 6 + 12)  # a's 6 floats, the int64 signs as 12
    out = second(packed)
    assert torch.equal(out, model(x))
    out.sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    assert torch.allclose(x.grad, expected)


def test_data_dependent_control_flow_is_one_error_naming_the_node() -> None:
    with pytest.raises(UserError) as error:
        grab(Branchy())
    text = str(error.value)
    assert "node 'gt' in module 'inner.0'" in text and "`if x.sum() > 0:`" in text
    assert "leaf_modules=[BranchyBlock]" in text and f"--leaf {__name__}:BranchyBlock" in text
    assert "\n" not in text and error.value.__cause__ is None and error.value.__suppress_context__
    graph = grab(Branchy(), leaf_modules=[BranchyBlock])  # the fix works
    assert graph.names == ("inner.0",)


def test_tied_weights_are_listed_not_refused() -> None:
    assert grab(Tied()).ties == (Tie(("a.weight", "c.weight"), ("a", "c")),)


@pytest.mark.parametrize(("model", "match"), [
    (Twice(), r"module 'a' of 'm' runs at two separate places in forward"),
    (nn.Linear(5, 3), r"failed at node 'linear'? .*mat1 and mat2 shapes cannot be multiplied"),
])
def test_uncapturable_models_are_one_line(model: nn.Module, match: str) -> None:
    with pytest.raises(UserError, match=match) as error:
        grab(model)
    assert "\n" not in str(error.value)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x + y)  # type: ignore[no-any-return]


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def test_one_output_only_and_several_inputs_as_dict_data_which_works() -> None:
    with pytest.raises(UserError, match=r"takes 2 inputs without defaults \(x, y\); give the data as dicts"):
        grab(TwoInputs())
    two = TensorSpec((12,), fields=(Field("x", (6,), "float32"), Field("y", (6,), "float32")))
    graph = capture_module(TwoInputs(), input=two, target=CLASS, loss=LossKind.CROSS_ENTROPY, name="m")  # followed
    x, y = torch.randn(3, 6), torch.randn(3, 6)
    out = torch.cat([x, y], dim=1)
    for i in range(len(graph)):
        out = graph.build_layer(i)(out)
    assert torch.allclose(out, TwoInputs()(x, y))
    with pytest.raises(UserError, match="returns a tuple; pipetrain captures models that return one tensor"):
        grab(Pair())


class ItemScale(nn.Module):
    """``.item()`` cannot run on fake tensors: shapes are then found on a real sample."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.abs().max().item() >= 0)


def test_leaf_with_a_value_dependent_operation_is_run_for_real_without_changing_state() -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), ItemScale(), nn.Linear(6, 3))
    graph = grab(model, leaf_modules=[ItemScale])
    assert graph.names == ("0", "1", "3")  # the leaf ItemScale holds no state: it runs with the BatchNorm
    assert int(qualified_state(graph)["1.num_batches_tracked"]) == 0  # BatchNorm saw no sample


# ---- pickling and whole-model modules -------------------------------------------------------


def _spawned_forward(rank: int, graph: LayerGraph, x: torch.Tensor, out: str) -> None:
    torch.save(whole_model(graph)(x).detach(), out)


def test_layers_pickle_and_rebuild_in_a_spawned_process(tmp_path: Path) -> None:
    model = Residual().eval()
    graph = grab(model)
    graph = pickle.loads(pickle.dumps(graph))
    x = torch.randn(3, 6)
    expected = model(x)
    assert torch.equal(graph.build_sequential().eval()(x), expected)
    mp.spawn(_spawned_forward, args=(grab(Skip()), x, str(tmp_path / "out.pt")), nprocs=1)
    assert torch.load(tmp_path / "out.pt").shape == (3, 3)


def test_build_module_loads_pipeline_state_strictly() -> None:
    model = Residual()
    graph = grab(model)
    state = {k: v + 1 if v.is_floating_point() else v for k, v in qualified_state(graph).items()}
    whole = graph.build_module()
    whole.load_state_dict(state, strict=True)
    chain = graph.build_sequential()
    for layer, child in zip(graph.layers, chain, strict=True):
        child.load_state_dict({k: state[layer.qualified(k)] for k in child.state_dict()}, strict=True)
    x = torch.randn(4, 6)
    assert torch.equal(whole.eval()(x), chain.eval()(x))


def test_build_module_of_layers_is_a_named_sequential() -> None:
    graph = LayerGraph.from_layers([("body", nn.Linear(6, 6)), ("head", nn.Linear(6, 3))], input=VEC, target=CLASS)
    assert set(graph.build_module().state_dict()) == {"body.weight", "body.bias", "head.weight", "head.bias"}
    dotted = LayerGraph.from_layers([("a.b", nn.Linear(6, 3))], input=VEC, target=CLASS)
    with pytest.raises(UserError, match=r"layer names \['a\.b'\] have dots"):
        dotted.build_module()


# ---- models by reference ---------------------------------------------------------------------


USER_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Gate(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.gate, self.head = nn.Linear(64, 16), Gate(), nn.Linear(16, 10)

        def forward(self, x):
            h = self.stem(x)
            return self.head(h + self.gate(h))

    def build():
        torch.manual_seed(0)
        return Net()

    def not_a_module():
        return 3

    def tokens():
        data = torch.utils.data.TensorDataset(torch.arange(40).view(10, 4) % 7, torch.arange(10) % 3)
        return data, data

    def doubles():
        data = torch.utils.data.TensorDataset(torch.zeros(10, 4, dtype=torch.float64), torch.zeros(10))
        return data, data
""")


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pt_user_model.py").write_text(USER_MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


DIGITS_IN, DIGITS_OUT = TensorSpec((64,)), TensorSpec((), "int64", high=10)


def test_load_model_captures_a_module_callable(user_dir: Path) -> None:
    graph = load_model("pt_user_model:build", input=DIGITS_IN, target=DIGITS_OUT, loss=None,
                       leaf_modules=["pt_user_model:Gate"])
    assert graph.name == "pt_user_model:build" and graph.names == ("stem", "head")  # the stateless gate joins stem
    assert graph.loss is LossKind.CROSS_ENTROPY
    again = load_model("pt_user_model:build", input=DIGITS_IN, target=DIGITS_OUT, loss=None,
                       leaf_modules=["pt_user_model:Gate"])
    assert again.fingerprint() == graph.fingerprint()
    assert load_model("gpt-tiny", input=None, target=None, loss=None).name == "gpt-tiny"


@pytest.mark.parametrize(("ref", "kwargs", "match"), [
    ("pt_user_model:not_a_module", {}, "returned a int; make it return an nn.Module"),
    ("pt_user_model:build", {"input": None}, "whose input and target shapes come from the data; pass --data"),
    ("pt_user_model:build", {}, r"node 'gt' in module 'gate'.*leaf_modules=\[Gate\] / --leaf pt_user_model:Gate"),
    ("pt_user_model:build", {"leaf_modules": ["pt_user_model:build"]}, "is not an nn.Module class"),
    ("no-such-model", {}, r"unknown model 'no-such-model'.*or name your own nn\.Module factory as module\.path"),
])
def test_load_model_errors(user_dir: Path, ref: str, kwargs: dict[str, object], match: str) -> None:
    settings: dict[str, object] = {"input": DIGITS_IN, "target": DIGITS_OUT, "loss": None, **kwargs}
    with pytest.raises(UserError, match=match):
        load_model(ref, **settings)  # type: ignore[arg-type]


def test_resolve_model_takes_specs_from_the_data(user_dir: Path) -> None:
    module_graph = api.resolve_model(nn.Sequential(nn.Linear(64, 10)), data="digits", name="lin")
    assert (module_graph.name, module_graph.input, module_graph.target) == ("lin", DIGITS_IN, DIGITS_OUT)
    ref_graph = api.resolve_model("pt_user_model:build", data="digits", loss="pt_user_model:build",
                                  leaf_modules=["pt_user_model:Gate"])
    assert ref_graph.loss is LossKind.CROSS_ENTROPY  # a callable loss: the targets' default kind
    assert api.resolve_model("gpt-tiny", data="digits").name == "gpt-tiny"  # zoo names ignore data
    for data in (None, "synthetic", "text"):
        with pytest.raises(UserError, match=r"pass .*--data.* digits or .*module\.path:callable"):
            api.resolve_model(nn.Linear(64, 10), data=data)


def test_data_specs_of_a_user_factory(user_dir: Path) -> None:
    assert data_specs("pt_user_model:tokens", "m") == (TensorSpec((4,), "int64", high=7),
                                                       TensorSpec((), "int64", high=3))
    with pytest.raises(UserError, match="yields inputs of dtype float64; make them one of float32"):
        data_specs("pt_user_model:doubles", "m")


def test_graph_for_plan_rebuilds_a_user_model(user_dir: Path) -> None:
    graph = api.resolve_model("pt_user_model:build", data="digits", leaf_modules=["pt_user_model:Gate"])
    stages = (StagePlan(("stem",), (0,), (8,), (8,)), StagePlan(("head",), (1,), (8,), (8,)))
    plan = Plan(graph.name, graph.fingerprint(), 8, Method.GPIPE, stages)
    rebuilt = api.graph_for_plan(Plan.from_json(plan.to_json()), data="digits", leaf_modules=["pt_user_model:Gate"])
    assert rebuilt.names == graph.names and rebuilt.fingerprint() == graph.fingerprint()


def test_captured_layers_are_the_same_in_every_process() -> None:
    """Parameter order (and so the fingerprint a plan records) must not depend on hash seeds."""
    import subprocess
    import sys

    script = (
        "from examples.custom_model import build\n"
        "from pipetrain import api\n"
        "g = api.resolve_model(build(), data='examples.custom_model:digits_data')\n"
        "print(g.fingerprint(), [n for n, _ in g.build_layer(1).named_parameters()])\n"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1, outputs
