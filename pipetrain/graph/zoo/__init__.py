"""The model zoo: named presets that build a LayerGraph.

    >>> graph = build_model("gpt-tiny", blocks=2)
    >>> len(graph), graph.name
    (4, 'gpt-tiny')

Presets (sizes are overridable by keyword; each family's module documents its settings):

| name            | family    | layers | what                                                          |
|-----------------|-----------|--------|---------------------------------------------------------------|
| ``mlp``         | mlp       | 8      | 1024 → 4096 → 1024 per layer, 1024 classes                    |
| ``mlp-digits``  | mlp       | 4      | scikit-learn digits: 64 inputs, 64 → 256 → 64, 10 classes     |
| ``cnn-digits``  | convnet   | 5      | digits as 1×8×8 images: 4 conv layers (16-64 ch), GAP, linear |
| ``resnet-digits``| convnet  | 5      | digits as 1×8×8 images: stem, 3 basic blocks with BN, GAP, fc |
| ``vit-digits``  | vit       | 6      | digits as 1×8×8 images: 2×2 patches, D=32, 4 heads, 4 blocks  |
| ``gpt-tiny``    | gpt       | 6      | V=256, T=32, H=64, 4 heads, 4 blocks; trains on a CPU         |
| ``gpt1-14``     | gpt       | 14     | GPT-1 sizes (Radford et al. 2018)                             |
| ``vgg16``       | vgg       | 16     | VGG-16 D without BN, 224×224, 1000 classes                    |
| ``vgg16-32``    | vgg       | 16     | VGG-16 D without BN, 32×32, FC 512, 10 classes                |
| ``resnet50``    | resnet    | 18     | ResNet-50 v1.5 with BN, 224×224, 1000 classes, 25.6 M weights |
| ``resnet50-32`` | resnet    | 18     | 32×32, CIFAR stem, width 1/4, 10 classes; trains on a CPU     |
| ``gnmt``        | gnmt      | 18     | GNMT 8 + 8 LSTM layers, H=1024, V=32000, T=50, attention      |
| ``gnmt-tiny``   | gnmt      | 8      | 3 + 3 layers, H=64, V=256, T=16; trains on a CPU              |
| ``synthetic``   | synthetic | 8      | variant 0: 256 features, 10 classes, mixed cost curves        |

Branchy models (DAGs: parallel branches merged by a ``concat`` layer, under the DAG contract of
:class:`~pipetrain.graph.layer_graph.LayerGraph`; ``branches.py`` has their building blocks):

| name                | family         | layers | what                                                     |
|---------------------|----------------|--------|----------------------------------------------------------|
| ``mmt``             | mmt            | 38     | 4 branches × (embed + 8 blocks), T=256, H=1024, 16 heads |
| ``mmt-tiny``        | mmt            | 14     | 4 branches × (embed + 2 blocks), T=8, H=32; CPU          |
| ``candle-uno``      | candle_uno     | 33     | 7 towers × 4 FF (H=4096), concat, 3 FF, MSE regression   |
| ``candle-uno-tiny`` | candle_uno     | 20     | 4 towers × 4 FF (H=32), concat, 2 FF; CPU                |
| ``dlrm``            | dlrm           | 40     | 7 FF towers × 4 (H=4096) + 7 bags (100 × 64), concat, FF |
| ``dlrm-tiny``       | dlrm           | 12     | 2 FF towers × 3 (H=32) + 2 bags (4 × 8), concat, FF; CPU |
| ``branchy-digits``  | branchy_digits | 8      | digits: MLP branch beside a conv branch, 3 layers each   |

``mmt``, ``candle-uno`` and ``dlrm`` are GraphPipe's benchmark models (docs/algorithms.md §5;
``candle-uno`` takes ``branches=`` up to 16 for its sweep). The model input is one tensor whose
slices (or the whole) feed the branches' source layers; ``dlrm``'s sparse indices travel in it as
floats (``dlrm.py`` says how). The ``-tiny`` presets train on a CPU in seconds.

The image models (VGG-16, ResNet-50) and GNMT are the benchmark models of PipeDream and BaPipe
(docs/algorithms.md §3, §4). ResNet's BatchNorm makes pipelined training differ slightly from unpipelined
training (statistics are per micro-batch); the others compute the same numbers either way. GNMT is
reduced to a chain whose layers pass ``[b, T, 2H]`` tensors; ``gnmt.py`` says what is GNMT's and
what is ours.

``synthetic`` draws its layers from a generator seeded by its ``variant`` setting (the one setting
that may be 0): ``build_model("synthetic", variant=3)``. The names ``synthetic-<k>`` (``k`` >= 0,
e.g. ``synthetic-3``) build variant ``k`` under that name, for command lines and plan files, which
name a model but cannot carry settings.

Every layer factory is a module-level class or a ``functools.partial`` of one, so a LayerGraph
pickles into spawned rank processes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import (
    branchy_digits,
    candle_uno,
    digit_convnets,
    dlrm,
    gnmt,
    gpt,
    mlp,
    mmt,
    resnet,
    synthetic,
    vgg,
    vit,
)

__all__ = ["MODEL_NAMES", "build_model"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


@dataclass(frozen=True)
class _Preset(Generic[C]):
    """A family's builder and the sizes it is called with."""

    config: C
    build: Callable[[C, str, int], LayerGraph]


_PRESETS: dict[str, _Preset[Any]] = {
    "mlp": _Preset(mlp.MLPConfig(), mlp.build),
    "mlp-digits": _Preset(
        mlp.MLPConfig(n_layers=4, inputs=64, width=64, hidden=256, classes=10), mlp.build
    ),
    "cnn-digits": _Preset(digit_convnets.DigitConvConfig(), digit_convnets.build_cnn),
    "resnet-digits": _Preset(digit_convnets.DigitConvConfig(), digit_convnets.build_resnet),
    "vit-digits": _Preset(vit.ViTConfig(), vit.build),
    "gpt-tiny": _Preset(
        gpt.GPTConfig(vocab=256, context=32, hidden=64, heads=4, blocks=4), gpt.build
    ),
    "gpt1-14": _Preset(gpt.GPTConfig(), gpt.build),
    "vgg16": _Preset(vgg.VGGConfig(), vgg.build),
    "vgg16-32": _Preset(vgg.VGGConfig(image=32, classes=10, fc=512), vgg.build),
    "resnet50": _Preset(resnet.ResNetConfig(), resnet.build),
    "resnet50-32": _Preset(
        resnet.ResNetConfig(image=32, classes=10, width=0.25, stem_stride=1), resnet.build
    ),
    "gnmt": _Preset(gnmt.GNMTConfig(), gnmt.build),
    "gnmt-tiny": _Preset(
        gnmt.GNMTConfig(vocab=256, length=16, hidden=64, encoder_layers=3, decoder_layers=3),
        gnmt.build,
    ),
    "synthetic": _Preset(synthetic.SyntheticConfig(), synthetic.build),
    "mmt": _Preset(mmt.MMTConfig(), mmt.build),
    "mmt-tiny": _Preset(
        mmt.MMTConfig(layers=2, seq=8, hidden=32, heads=4, ffn=128, features=16, classes=10),
        mmt.build,
    ),
    "candle-uno": _Preset(candle_uno.CandleUnoConfig(), candle_uno.build),
    "candle-uno-tiny": _Preset(
        candle_uno.CandleUnoConfig(branches=4, features=16, hidden=32, top=2), candle_uno.build
    ),
    "dlrm": _Preset(dlrm.DLRMConfig(), dlrm.build),
    "dlrm-tiny": _Preset(
        dlrm.DLRMConfig(
            dense=2, layers=3, features=8, hidden=32, sparse=2, bag=4, dim=8, rows=50, top=2
        ),
        dlrm.build,
    ),
    "branchy-digits": _Preset(branchy_digits.BranchyDigitsConfig(), branchy_digits.build),
}
_SYNTHETIC_VARIANT = re.compile(r"synthetic-(0|[1-9][0-9]*)")

MODEL_NAMES: tuple[str, ...] = tuple(_PRESETS)


def build_model(name: str, *, seed: int = 0, **overrides: int | float) -> LayerGraph:
    """Build the zoo model ``name``, with some of its sizes overridden.

    Args:
        name: one of ``MODEL_NAMES``, or ``synthetic-<k>`` for the synthetic network of variant k.
        seed: base seed of the layers' initial weights (see ``LayerGraph.build_layer``).
        **overrides: sizes to change, e.g. ``hidden=128`` for a GPT or ``width=0.25`` for a VGG.

    Returns:
        The LayerGraph; its ``name`` is the preset's name.

    Raises:
        UserError: an unknown name, an unknown setting, or a value that is not a positive number
            of the right type (``variant`` may be 0).
    """
    preset = _PRESETS.get(name)
    variant = _SYNTHETIC_VARIANT.fullmatch(name)
    if variant is not None:
        if "variant" in overrides:
            raise UserError(
                f"model {name!r} already names its variant; drop variant= or use 'synthetic'"
            )
        preset = _PRESETS["synthetic"]
        overrides = {**overrides, "variant": int(variant.group(1))}
    if preset is None:
        raise UserError(
            f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)} (or synthetic-<k>)"
        )
    config = _override(name, preset.config, overrides)
    return preset.build(config, name, seed)


def _override(name: str, config: C, overrides: dict[str, int | float]) -> C:
    """``config`` with ``overrides`` applied, each checked against the field it replaces."""
    defaults = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    minimum = {f.name: f.metadata.get("minimum") for f in dataclasses.fields(config)}
    for key, value in overrides.items():
        if key not in defaults:
            settings = ", ".join(defaults)
            raise UserError(f"model {name!r} has no setting {key!r}; its settings are: {settings}")
        _check_value(name, key, value, defaults[key], zero_ok=minimum[key] == 0)
    return dataclasses.replace(config, **overrides)


def _check_value(name: str, key: str, value: object, default: object, *, zero_ok: bool) -> None:
    """Settings are positive numbers of their default's type; a field whose metadata says
    ``{"minimum": 0}`` (the synthetic ``variant``) may also be 0."""
    integral = isinstance(default, int)
    allowed = (int,) if integral else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, allowed)
        or value < 0
        or (value == 0 and not zero_ok)
    ):
        sign = "a non-negative" if zero_ok else "a positive"
        kind = f"{sign} integer" if integral else f"{sign} number"
        raise UserError(f"model {name!r}: {key} must be {kind}, got {value!r}")
