"""Where a captured model is cut (issue 26 §2): the owner rule, the grouping of glue, the merge of
stateless runs, on models built like torchvision's and on hand-made trees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipetrain.graph.owners import Owners, group, merge_stateless
from tests.vision_models import Encoder, MobileNetV2Like, ResNetLike, ViTLike


@pytest.mark.parametrize(("path", "owner"), [
    ("conv1", "conv1"),
    ("relu", "relu"),  # a layer of its own here; merge_stateless folds it into bn1
    ("layer1", None),  # a container: walked into
    ("layer1.0", "layer1.0"),
    ("layer1.0.conv2", "layer1.0"),
    ("layer2.0.downsample", "layer2.0"),  # an entry holding a container stays whole
    ("layer2.0.downsample.1", "layer2.0"),
    ("fc", "fc"),
    ("", None),  # the root's own code: glue
])
def test_resnet_blocks_are_layers(path: str, owner: str | None) -> None:
    assert Owners(ResNetLike())(path) == owner


@pytest.mark.parametrize(("path", "owner"), [
    ("features.0", None),  # Conv2dNormActivation is a Sequential entry of a Sequential: split again
    ("features.0.0", "features.0.0"),
    ("features.0.2", "features.0.2"),
    ("features.2", "features.2"),
    ("features.2.conv.1.2", "features.2"),
    ("classifier.1", "classifier.1"),
])
def test_mobilenet_sequentials_of_sequentials_split(path: str, owner: str | None) -> None:
    assert Owners(MobileNetV2Like())(path) == owner


@pytest.mark.parametrize(("path", "owner"), [
    ("conv_proj", "conv_proj"),
    ("encoder", None),  # holds the container `layers`: walked through, its forward is glue
    ("encoder.dropout", "encoder.dropout"),
    ("encoder.layers.encoder_layer_1", "encoder.layers.encoder_layer_1"),
    ("encoder.layers.encoder_layer_1.mlp.3", "encoder.layers.encoder_layer_1"),
    ("encoder.ln", "encoder.ln"),
    ("heads.head", "heads.head"),
])
def test_vit_encoder_layers_are_layers(path: str, owner: str | None) -> None:
    assert Owners(ViTLike())(path) == owner


def test_a_module_kept_whole_is_one_layer_where_it_would_be_walked_through() -> None:
    owners = Owners(ViTLike(), whole=lambda module: isinstance(module, Encoder))
    assert owners("encoder") == owners("encoder.layers.encoder_layer_0.ln_1") == "encoder"
    assert owners("conv_proj") == "conv_proj"


class Holder(nn.Module):
    """Not a container entry, holds a ModuleDict two levels down (through ``inner``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Module()
        self.inner.table = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Sequential(nn.Linear(2, 2), nn.ReLU())})
        self.plain = nn.Linear(2, 2)


def test_modules_holding_containers_deep_down_are_walked_through() -> None:
    root = nn.Module()
    root.holder = Holder()
    root.list = nn.ModuleList([nn.ModuleList([nn.Linear(2, 2)]), Holder()])
    owners = Owners(root)
    assert owners("holder") is None and owners("holder.inner") is None
    assert owners("holder.inner.table.a") == "holder.inner.table.a"
    assert owners("holder.inner.table.b.0") == "holder.inner.table.b.0"  # a ModuleDict entry that is a Sequential
    assert owners("holder.plain") == "holder.plain"
    assert owners("list.0.0") == "list.0.0"  # a list in a list splits
    assert owners("list.1.inner.table.a") == "list.1"  # a list entry stays whole


def test_a_sequential_root_splits_like_any_sequential() -> None:
    owners = Owners(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU())))
    assert (owners("0"), owners("1"), owners("1.1")) == ("0", None, "1.1")


def test_stateless_means_no_parameter_and_no_persistent_buffer() -> None:
    root = nn.Module()
    root.act, root.fc, root.bn = nn.ReLU(), nn.Linear(2, 2), nn.BatchNorm1d(2, affine=False)
    root.scaled = nn.Module()
    root.scaled.register_buffer("scale", torch.ones(2), persistent=False)
    owners = Owners(root)
    assert [owners.stateless(o) for o in ("act", "fc", "bn", "scaled", "")] == [True, False, False, True, True]


def test_group_puts_glue_with_the_node_before_and_leading_glue_in_a_root_run() -> None:
    owned = [(1, None), (2, "a"), (3, None), (4, "a"), (5, "b"), (6, None), (7, "a")]
    assert group(owned) == [("", [1]), ("a", [2, 3, 4]), ("b", [5, 6]), ("a", [7])]
    assert group([]) == []


STATELESS = {"", "relu", "pool", "drop", "act"}


def test_merge_folds_stateless_runs_into_the_layer_before_and_the_first_into_the_one_after() -> None:
    runs = [("", ["n"]), ("relu", ["a"]), ("conv", ["b"]), ("relu", ["c"]), ("pool", ["d"]), ("fc", ["e"]),
            ("drop", ["f"])]
    assert merge_stateless(runs, STATELESS.__contains__) == [("conv", ["n", "a", "b", "c", "d"]), ("fc", ["e", "f"])]
    assert runs[2] == ("conv", ["b"])  # the input is not changed


def test_merge_joins_a_layer_split_by_a_stateless_run_and_keeps_true_repeats() -> None:
    split = [("blk", [1]), ("act", [2]), ("blk", [3]), ("fc", [4])]
    assert merge_stateless(split, STATELESS.__contains__) == [("blk", [1, 2, 3]), ("fc", [4])]
    repeat = [("blk", [1]), ("fc", [2]), ("blk", [3])]
    assert merge_stateless(repeat, STATELESS.__contains__) == repeat  # capture reports this one


def test_merge_of_only_stateless_runs_is_one_run_of_the_first_owner() -> None:
    assert merge_stateless([("relu", [1]), ("act", [2])], STATELESS.__contains__) == [("relu", [1, 2])]
    assert merge_stateless([], STATELESS.__contains__) == []
