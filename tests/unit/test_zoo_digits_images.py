"""The digits image models of the zoo (cnn-digits, resnet-digits, vit-digits) and the digits as images."""

from __future__ import annotations

import pytest
import torch

from pipetrain.data import load_datasets
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.runtime import reference_train
from pipetrain.runtime.job.config import TrainConfig
from pipetrain.runtime.job.data import make_batch

SHAPES = {
    "cnn-digits": [(16, 8, 8), (32, 8, 8), (32, 4, 4), (64, 4, 4), (10,)],
    "resnet-digits": [(16, 8, 8), (16, 8, 8), (32, 4, 4), (32, 4, 4), (10,)],
    "vit-digits": [(16, 32)] * 5 + [(10,)],
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_image_models_take_the_digits_as_1x8x8_images(name: str) -> None:
    graph = build_model(name)
    assert graph.input.shape == (1, 8, 8)
    assert [s.shape for s in graph.output_specs()] == SHAPES[name]
    x, y = make_batch(graph, 4, 0, 0, "digits")
    assert x.shape == (4, 1, 8, 8) and y.shape == (4,)
    assert graph.build_sequential()(x).shape == (4, 10)


def test_digits_images_hold_the_same_pixels_as_the_features() -> None:
    flat = load_datasets("digits", build_model("mlp-digits")).train[5][0]
    image = load_datasets("digits", build_model("cnn-digits")).train[5][0]
    assert image.shape == (1, 8, 8) and torch.equal(image.flatten(), flat)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_image_models_learn_the_digits_in_two_epochs(name: str) -> None:
    config = TrainConfig(epochs=2, data="digits", optimizer="adam", lr=0.003, progress=False)
    result = reference_train(build_model(name), 32, config, return_state_dict=False)
    accuracy = result.metrics[-1].eval_accuracy
    assert accuracy is not None and accuracy > 0.5  # chance is 0.1


def test_vit_settings_are_checked() -> None:
    with pytest.raises(UserError, match="multiple of patch"):
        build_model("vit-digits", patch=3)
