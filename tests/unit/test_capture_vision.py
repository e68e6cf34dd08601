"""Vision models captured at block granularity (issue 26 §2, §6): models built like torchvision's
(``tests/vision_models.py``) and, where ``import torchvision`` works, torchvision's own.

Each capture runs exactly as the module does, keeps the module's ``state_dict`` keys, and can be cut
between any two layers the way a pipeline cuts it (the second part receiving a leaf of autograd),
in-place activations included; fx failures inside a block name a fix that works when followed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.capture import capture
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.load import leaf_classes
from tests.vision_models import CLASSES, IMAGE, ConvNormActivation, Encoder, MobileNetV2Like, ResNetLike, ViTLike

LABEL = TensorSpec((), "int64", high=CLASSES)

RESNET_NAMES = ("conv1", "bn1", *(f"layer{i}.{j}" for i in range(1, 5) for j in range(2)), "fc")
MOBILENET_NAMES = ("features.0.0", "features.0.1", "features.1", "features.2", "features.3", "features.4.0",
                   "features.4.1", "classifier.1")
VIT_NAMES = ("conv_proj", *(f"encoder.layers.encoder_layer_{i}" for i in range(3)), "encoder.ln", "heads.head")


def grab(module: nn.Module, shape: tuple[int, ...] = IMAGE, **kwargs: object) -> LayerGraph:
    return capture(module, input=TensorSpec(shape), target=LABEL, loss=LossKind.CROSS_ENTROPY, name="m",
                   **kwargs)  # type: ignore[arg-type]


def qualified_state(graph: LayerGraph) -> dict[str, torch.Tensor]:
    return {layer.qualified(k): v for i, layer in enumerate(graph.layers)
            for k, v in graph.build_layer(i).state_dict().items()}


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[str, ...]]] = {
    "resnet": (ResNetLike, RESNET_NAMES),
    "mobilenet": (lambda: MobileNetV2Like(dropout=0.0), MOBILENET_NAMES),
    "vit": (ViTLike, VIT_NAMES),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_layers_are_the_blocks_and_run_exactly_as_the_module(kind: str) -> None:
    """ResNet: relu and maxpool run with bn1, avgpool with layer4.1; MobileNet: each ReLU6 with its
    BatchNorm, the pooling and the Dropout with features.4.1; ViT: the class token, position
    embedding and dropout with conv_proj."""
    build, names = MODELS[kind]
    model = build()
    graph = grab(model)
    assert graph.names == names and graph.is_chain
    state = qualified_state(graph)
    assert set(state) == set(model.state_dict())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    x = torch.randn(4, *IMAGE)
    chain = graph.build_sequential()
    assert torch.equal(chain(x), model(x))  # training mode: BatchNorm on the batch's statistics
    assert torch.equal(chain.eval()(x), model.eval()(x))


def test_vit_first_layer_holds_the_tokens_of_the_walked_through_encoder() -> None:
    graph = grab(ViTLike())
    assert set(graph.build_layer(0).state_dict()) == {"conv_proj.weight", "conv_proj.bias", "class_token",
                                                      "encoder.pos_embedding"}


def _split_gradients(graph: LayerGraph, cut: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Layers ``[0, cut)`` then ``[cut, n)`` as two pipeline stages: the second receives a detached
    leaf that requires grad, its gradient goes back to the first. Gradients by the model's names."""
    first, second = graph.build_sequential(range(cut)), graph.build_sequential(range(cut, len(graph)))
    sent = first(x)
    received = sent.detach().requires_grad_(True)
    second(received).square().sum().backward()
    sent.backward(received.grad)
    return {graph.layers[i].qualified(k): p.grad for stage, offset in ((first, 0), (second, cut))
            for i, child in enumerate(stage, offset) for k, p in child.named_parameters()}  # type: ignore[misc]


class PreAct(nn.Module):
    """A block whose first operation is an in-place ReLU on its input."""

    def __init__(self) -> None:
        super().__init__()
        self.relu, self.fc = nn.ReLU(inplace=True), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu(x))


class PreActNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.blocks, self.head = nn.Linear(6, 6), nn.ModuleList(PreAct() for _ in range(2)), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(torch.relu_(x))


@pytest.mark.parametrize(("build", "shape"), [(lambda: MobileNetV2Like(dropout=0.0), IMAGE), (PreActNet, (6,))])
def test_in_place_operations_on_a_stage_input_run_and_give_the_modules_gradients(
        build: Callable[[], nn.Module], shape: tuple[int, ...]) -> None:
    """Cut before every layer: MobileNet's ReLU6(inplace) never starts a layer (it runs with its
    BatchNorm); PreAct's in-place ReLU does, on a copy of the received tensor."""
    model = build()
    graph = grab(model, shape)
    x = torch.randn(4, *shape)
    model(x.clone()).square().sum().backward()
    expected = {k: p.grad for k, p in model.named_parameters()}
    for cut in range(1, len(graph)):
        found = _split_gradients(graph, cut, x.clone())
        assert set(found) == set(expected)
        assert all(torch.allclose(found[k], g, rtol=1e-5, atol=1e-6) for k, g in expected.items()), cut  # type: ignore[arg-type]


# ---- modules kept whole ----------------------------------------------------------------------


def test_a_leaf_sequential_keeps_conv_norm_and_activation_in_one_layer() -> None:
    model = MobileNetV2Like(dropout=0.0)
    graph = grab(model, leaf_modules=[ConvNormActivation])
    assert graph.names == ("features.0", "features.1", "features.2", "features.3", "features.4", "classifier.1")
    x = torch.randn(2, *IMAGE)
    assert torch.equal(graph.build_sequential()(x), model(x))


class Tokens(nn.Module):
    """A torch.nn TransformerEncoder (fx keeps it whole) holding its ModuleList ``layers``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), 2,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def test_a_module_fx_keeps_whole_is_a_layer_though_it_holds_a_container() -> None:
    model = Tokens()
    graph = grab(model, (4, 6))
    assert graph.names == ("embed", "encoder", "head")
    x = torch.randn(2, 4, 6)
    assert torch.equal(graph.build_sequential()(x), model(x))


# ---- errors that fix -------------------------------------------------------------------------


class Clip(nn.Module):
    """Clips outliers, deciding in Python on a tensor's value: fx cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max() > 1e4:
            return x.clamp(-1e4, 1e4)
        return x


class CheckedEncoder(Encoder):
    """An encoder (walked through by capture) whose own forward branches on a tensor's value."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.isnan().any():
            raise ValueError("NaN input")
        return super().forward(input)


def _vit_with_clip() -> nn.Module:
    model = ViTLike()
    model.encoder.layers.encoder_layer_1.mlp.append(Clip())  # type: ignore[operator, union-attr]
    return model




def _vit_with_encoder(cls: type[Encoder]) -> nn.Module:
    model = ViTLike()
    encoder = cls(17, 3, 2, 16, 32, 0.0)
    encoder.load_state_dict(model.encoder.state_dict())
    model.encoder = encoder
    return model


@pytest.mark.parametrize(("build", "where", "names"), [
    (_vit_with_clip, "module 'encoder.layers.encoder_layer_1.mlp.5'", VIT_NAMES),
    (lambda: _vit_with_encoder(CheckedEncoder), "module 'encoder'", ("conv_proj", "encoder", "heads.head")),
])
def test_fx_failure_is_one_line_whose_leaf_remedy_works_when_followed(
        build: Callable[[], nn.Module], where: str, names: tuple[str, ...]) -> None:
    model = build()
    with pytest.raises(UserError) as error:
        grab(model)
    text = str(error.value)
    assert "\n" not in text and re.search(rf"node '\w+' in {re.escape(where)} \(", text), text
    assert re.search(r"test_capture_vision\.py:\d+ `if .*:`", text)
    leaf = re.search(r"--leaf (\S+)\)", text)
    assert leaf is not None
    graph = grab(model, leaf_modules=leaf_classes([leaf.group(1)]))  # what the message says to do
    assert graph.names == names
    x = torch.randn(3, *IMAGE)
    assert torch.equal(graph.build_sequential()(x), model(x))


class MaskedEncoder(Encoder):
    """Keeps an int64 mask from before its blocks to after them: every cut between them carries it,
    packed beside the float activations."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        keep = (input.abs().sum(-1, keepdim=True) > 0).long()
        return super().forward(input) * keep


class ScaledEncoder(Encoder):
    """Keeps a scalar of the whole batch (not batched along dim 0) until after its blocks: no cut
    between them can carry it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        scale = input.abs().max()
        return super().forward(input) / scale


class LoopedEncoder(Encoder):
    """Runs its first block again after the others: the block's weights would sit in two layers."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        first = self.layers.encoder_layer_0
        return self.ln(first(self.layers(self.dropout(input + self.pos_embedding))))  # type: ignore[no-any-return]


@pytest.mark.parametrize(("cls", "failure"), [
    (ScaledEncoder, r"cannot cut 'm' between layers 'conv_proj' and 'encoder\.layers\.encoder_layer_0': "
                    r".*not batched along dim 0"),
    (LoopedEncoder, r"module 'encoder\.layers\.encoder_layer_0' of 'm' runs at two separate places"),
])
def test_a_failure_between_blocks_names_the_module_to_keep_whole_and_that_works(
        cls: type[Encoder], failure: str) -> None:
    model = _vit_with_encoder(cls)
    with pytest.raises(UserError, match=failure) as error:
        grab(model)
    text = str(error.value)
    assert "\n" not in text and f"mark {cls.__name__} ('encoder', which " in text
    leaf = re.search(r"--leaf (\S+)\)", text)
    assert leaf is not None and leaf.group(1) == f"{__name__}:{cls.__name__}"
    graph = grab(model, leaf_modules=leaf_classes([leaf.group(1)]))
    assert graph.names == ("conv_proj", "encoder", "heads.head")
    x = torch.randn(3, *IMAGE)
    assert torch.equal(graph.build_sequential()(x), model(x))


def test_an_int_mask_crosses_every_cut_between_blocks_packed_beside_the_activations() -> None:
    model = _vit_with_encoder(MaskedEncoder)
    graph = grab(model)
    assert graph.names[:2] == ("conv_proj", "encoder.layers.encoder_layer_0")
    x = torch.randn(3, *IMAGE)
    assert torch.equal(graph.build_sequential()(x), model(x))


# ---- torchvision's own models ----------------------------------------------------------------


def _torchvision_cases() -> dict[str, tuple[Callable[[], nn.Module], tuple[str, ...]]]:
    models = pytest.importorskip("torchvision.models")
    return {
        "resnet18": (lambda: models.resnet18(num_classes=CLASSES), RESNET_NAMES),
        "mobilenet_v2": (lambda: models.mobilenet_v2(num_classes=CLASSES),
                         ("features.0.0", "features.0.1", *(f"features.{i}" for i in range(1, 18)),
                          "features.18.0", "features.18.1", "classifier.1")),
        "vit": (lambda: models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                                                 hidden_dim=16, mlp_dim=32, num_classes=CLASSES),
                ("conv_proj", "encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1", "encoder.ln",
                 "heads.head")),
    }


@pytest.mark.parametrize("kind", ["resnet18", "mobilenet_v2", "vit"])
def test_torchvision_models_capture_at_their_blocks(kind: str) -> None:
    build, names = _torchvision_cases()[kind]
    model = build().eval()
    graph = grab(model, (3, 32, 32))
    assert graph.names == names
    assert set(qualified_state(graph)) == set(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(graph.build_sequential().eval()(x), model(x))
