"""Data sources by name: ``digits``, ``text``, ``synthetic`` or a user's ``module.path:callable``.

=================  ==============================================================================
``digits``         scikit-learn's 8×8 digits, 1,437 train / 360 eval (:mod:`pipetrain.data.digits`)
``text``           bytes of ``pydoc_data.topics``, 90% train / 10% eval (:mod:`pipetrain.data.text`)
``synthetic``      random batches from the model's specs, no datasets (:mod:`pipetrain.data.synthetic`)
``text:PATH``      a local text file, causal LM windows (:mod:`pipetrain.data.text_file`)
``mod.path:fn``    ``fn()`` returns ``(train_dataset, eval_dataset)``: map-style torch Datasets
                   whose items are ``(input, target)`` tensors, input shaped as the model's input,
                   or dicts of tensors with the target under ``labels`` (Hugging Face style,
                   :mod:`pipetrain.data.fields`)
=================  ==============================================================================

A user's module is imported from the working directory first, then ``sys.path``; the factory is
called once per process (every rank calls it, so it must be deterministic). The built-in datasets
are materialised once per process.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from pipetrain.callables import is_callable_ref, load_callable
from pipetrain.data import digits, text
from pipetrain.data.loader import BatchSource, StepLoader
from pipetrain.data.pair import DatasetPair, check_pair, sample_spec
from pipetrain.data.synthetic import SyntheticBatches
from pipetrain.data.text_file import is_text_file, text_file_pair
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, TensorSpec

__all__ = ["SOURCE_NAMES", "check_fits", "check_source_name", "data_specs", "default_source", "load_datasets",
           "train_batches"]

SOURCE_NAMES = ("digits", "text", "synthetic")


def check_source_name(source: str) -> None:
    """Check the form of a source name without importing or loading anything.

    Raises:
        UserError: neither a built-in name nor ``module.path:callable``.
    """
    if source not in SOURCE_NAMES and not is_text_file(source) and not is_callable_ref(source):
        raise UserError(f"data {source!r} is unknown; use {', '.join(SOURCE_NAMES)}, text:PATH or module.path:callable")


def default_source(graph: LayerGraph) -> str:
    """The built-in data a model fits: ``digits`` (64 features in, 10 classes out, e.g. ``mlp-digits``),
    ``text`` (byte tokens in and out, e.g. ``gpt-tiny``), else ``synthetic``."""
    for name, check in (("digits", _check_digits_model), ("text", _check_text_model)):
        try:
            check(graph)
        except UserError:
            continue
        return name
    return "synthetic"


def check_fits(source: str, graph: LayerGraph) -> None:
    """Check that ``source`` can feed ``graph``, loading no built-in data: its name, the digits' or the
    text's shapes against the model's, and a text file's or a factory's datasets (read once per
    process, so the run later reuses them).

    Raises:
        UserError: as :func:`load_datasets`.
    """
    check_source_name(source)
    if source == "digits":
        _check_digits_model(graph)
    elif source == "text":
        _check_text_model(graph)
    elif source != "synthetic":
        load_datasets(source, graph)


def load_datasets(source: str, graph: LayerGraph) -> DatasetPair:
    """The train and eval datasets of ``source``, checked against ``graph``'s input spec.

    Raises:
        UserError: an unknown source, ``synthetic`` (it has no datasets), data that does not fit the
            model, or a factory that fails.
    """
    check_source_name(source)
    if source == "synthetic":
        raise UserError("the synthetic data is drawn per step and has no datasets; choose digits, text or your own")
    if source == "digits":
        _check_digits_model(graph)
        return digits.digits_pair(images=graph.input.shape == digits.IMAGE)
    if source == "text":
        _check_text_model(graph)
        return text.text_pair(graph.input.shape[0])
    return check_pair(_user_pair(source), source, graph.name, graph.input)


def data_specs(source: str, model: str) -> tuple[TensorSpec, TensorSpec]:
    """Per-sample ``(input, target)`` specs of ``source``'s train samples, for a model that takes its
    shapes from the data (a user's ``nn.Module``, named ``model`` in errors).

    An integer spec's ``high`` is 1 + the largest value among the first 1,024 samples.

    Raises:
        UserError: ``synthetic`` or ``text``, whose shapes come from the model, a factory that
            fails, or samples of a dtype models do not take.
    """
    check_source_name(source)
    if source in ("synthetic", "text"):
        raise UserError(f"model {model!r} takes its input and target shapes from the data, but the {source} data "
                        "takes them from the model; pass --data digits or --data module.path:callable")
    pair = digits.digits_pair() if source == "digits" else check_pair(_user_pair(source), source, model, None)
    items = [pair.train[i] for i in range(min(_SCANNED, len(pair.train)))]  # type: ignore[arg-type]
    specs = []
    for j, spec in enumerate(sample_spec(pair.train)):
        if spec.dtype not in _DTYPES:
            raise UserError(f"data {source!r} yields {('inputs', 'targets')[j]} of dtype {spec.dtype}; make them one "
                            f"of {', '.join(_DTYPES)}")
        if not spec.torch_dtype.is_floating_point:
            spec = replace(spec, high=1 + int(max(int(item[j].max()) for item in items)))
        specs.append(spec)
    return specs[0], specs[1]


_SCANNED = 1024
_DTYPES = ("float32", "float16", "bfloat16", "int64")


def train_batches(source: str, graph: LayerGraph, batch_size: int, seed: int) -> BatchSource:
    """Step-indexed training batches of ``source`` for ``graph`` (see :mod:`pipetrain.data.loader`).

    Returns:
        ``SyntheticBatches`` for ``synthetic``, else a ``StepLoader`` over the train dataset.
    """
    check_source_name(source)
    if source == "synthetic":
        return SyntheticBatches(graph.input, graph.target, batch_size, seed)
    return StepLoader(load_datasets(source, graph).train, batch_size, seed, name=f"data {source!r}")


def _check_digits_model(graph: LayerGraph) -> None:
    spec, target = graph.input, graph.target
    fits = spec.shape in ((digits.FEATURES,), digits.IMAGE) and spec.dtype == "float32" and target.shape == ()
    if not fits or target.dtype != "int64" or (target.high is not None and target.high < digits.CLASSES):
        raise UserError(
            f"the digits data has {digits.FEATURES} features (float32) in and a class in [0, {digits.CLASSES}) out per "
            f"sample (as {digits.FEATURES} features or a {digits.IMAGE} image), but model {graph.name!r} takes "
            f"inputs {_spec(spec)} and targets {_spec(target)}; use a model such as 'mlp-digits' or the synthetic data"
        )


def _check_text_model(graph: LayerGraph) -> None:
    spec, target = graph.input, graph.target
    tokens = len(spec.shape) == 1 and spec.dtype == "int64" and target.shape == spec.shape and target.dtype == "int64"
    if not tokens or (spec.high is not None and spec.high < text.VOCAB):
        raise UserError(
            f"the text data has byte tokens [T] int64 in [0, {text.VOCAB}) in and the next bytes out, but model "
            f"{graph.name!r} takes inputs {_spec(spec)} and targets {_spec(target)}; use a model such as 'gpt-tiny' "
            "or the synthetic data"
        )


def _spec(spec: TensorSpec) -> str:
    """``(32,) int64 in [0, 256)``: a per-sample spec as errors show it."""
    values = f" in [0, {spec.high})" if spec.high is not None else ""
    return f"{spec.shape} {spec.dtype}{values}"


def _user_pair(source: str) -> object:
    """The datasets of a text file or a user's factory, unchecked."""
    return text_file_pair(source) if is_text_file(source) else _call_factory(source)


@functools.lru_cache(maxsize=4)
def _call_factory(ref: str) -> object:
    """What the factory ``ref`` returns (called once per process)."""
    factory = load_callable(ref, "data factory")
    try:
        return factory()
    except Exception as error:
        message = " ".join(str(error).split())
        raise UserError(
            f"data factory {ref!r} raised {type(error).__name__}: {message}; fix the factory so that it returns "
            "(train_dataset, eval_dataset)"
        ) from error
