"""The data layer: built-in sources, step-indexed sampling, user factories and losses (level a)."""

from __future__ import annotations

import pickle
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipetrain.callables import load_callable
from pipetrain.data import (
    DatasetPair,
    EpochSampler,
    Sample,
    StepLoader,
    eval_batches,
    load_datasets,
    resolve_loss,
    train_batches,
)
from pipetrain.data.pair import tensor_pairs
from pipetrain.data.text import corpus_bytes
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LossKind, TensorSpec, loss_sum
from pipetrain.graph.zoo import build_model
from pipetrain.runtime import TrainConfig
from pipetrain.runtime.job.data import make_batch, timed_batch

from ..gloo.models import mlp_graph

DIGITS = build_model("mlp-digits")
GPT = build_model("gpt-tiny")


# ---- built-in sources --------------------------------------------------------------------------


def test_digits_split_shapes_and_standardisation() -> None:
    pair = load_datasets("digits", DIGITS)
    assert (len(pair.train), len(pair.eval)) == (1437, 360)  # type: ignore[arg-type]
    x, y = pair.train[0]
    assert x.shape == (64,) and x.dtype == torch.float32 and y.shape == () and y.dtype == torch.int64
    train_x, train_y = pair.train.tensors  # type: ignore[attr-defined]
    _, eval_y = pair.eval.tensors  # type: ignore[attr-defined]
    assert train_x.mean(dim=0).abs().max() < 1e-5  # standardised with the train part's statistics
    assert set(train_y.tolist()) == set(eval_y.tolist()) == set(range(10))
    from sklearn.datasets import load_digits

    all_labels = torch.from_numpy(load_digits().target)
    assert torch.equal(torch.cat([train_y, eval_y]).bincount(), all_labels.bincount())  # a partition
    assert load_datasets("digits", DIGITS) is pair  # materialised once per process


def test_text_windows_shift_by_one_and_split_at_the_tail() -> None:
    pair = load_datasets("text", GPT)
    data = corpus_bytes()
    cut = len(data) - len(data) // 10
    assert len(pair.train) == (cut - 1) // 32 and len(pair.eval) == (len(data) - cut - 1) // 32  # type: ignore[arg-type]
    x, y = pair.train[5]
    assert x.shape == y.shape == (32,) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x, data[160:192]) and torch.equal(y, data[161:193])
    first_eval, _ = pair.eval[0]
    assert torch.equal(first_eval, data[cut:cut + 32])
    assert 0 <= int(data.min()) and int(data.max()) < 256
    assert "return" in bytes(data[:cut].tolist()).decode("utf-8")


def test_text_context_follows_the_model() -> None:
    small = build_model("gpt-tiny", context=8, blocks=1)
    x, y = train_batches("text", small, 4, 0).batch(0)
    assert x.shape == y.shape == (4, 8)


@pytest.mark.parametrize(
    ("source", "model", "match"),
    [
        ("digits", GPT, r"64 features .* takes inputs \(32,\) int64 in \[0, 256\)"),
        ("text", DIGITS, r"byte tokens .* takes inputs \(64,\) float32 and targets \(\) int64 in \[0, 10\)"),
        ("text", build_model("gpt-tiny", vocab=100, blocks=1), r"in \[0, 100\)"),
    ],
)
def test_builtin_sources_reject_models_that_do_not_fit(source: str, model: object, match: str) -> None:
    with pytest.raises(UserError, match=match):
        load_datasets(source, model)  # type: ignore[arg-type]


def test_synthetic_keeps_the_old_numbers() -> None:
    """Batch (seed, step): one generator seeded seed * 1_000_003 + step, inputs drawn before targets."""
    x, y = make_batch(mlp_graph(), 4, 7, 2, "synthetic")
    expected_row = [0.24395021796226501, -2.169896364212036, -1.4592130184173584, -0.15106533467769623,
                    0.907468855381012, -0.7111747860908508, -1.0292502641677856, -2.347229480743408]
    assert x[0].tolist() == expected_row and y.tolist() == [0, 2, 2, 3]
    tokens, next_tokens = make_batch(GPT, 2, 3, 1, "synthetic")
    assert tokens[0, :6].tolist() == [202, 31, 38, 55, 95, 152]
    assert next_tokens[1, :6].tolist() == [186, 178, 116, 76, 215, 185]
    generator = torch.Generator().manual_seed(5 * 1_000_003 + 9)
    x, y = make_batch(mlp_graph(), 3, 9, 5, "synthetic")
    assert torch.equal(x, torch.randn((3, 8), generator=generator))
    assert torch.equal(y, torch.randint(0, 4, (3,), generator=generator))


def test_synthetic_has_no_datasets_or_epochs() -> None:
    assert train_batches("synthetic", DIGITS, 4, 0).steps_per_epoch is None
    with pytest.raises(UserError, match="no datasets"):
        load_datasets("synthetic", DIGITS)


# ---- step-indexed sampling ---------------------------------------------------------------------


def _numbered(n: int) -> Dataset[Sample]:
    """Sample i is ``(tensor([i.0]), tensor(i))``: batches show which samples they hold."""
    return tensor_pairs(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))


def test_same_step_same_batch_from_independent_loaders() -> None:
    """Every rank builds its own loader; they agree without communicating."""
    a, b = StepLoader(_numbered(50), 8, seed=3), StepLoader(_numbered(50), 8, seed=3)
    for step in (0, 4, 6, 13, 40):
        assert all(torch.equal(u, v) for u, v in zip(a.batch(step), b.batch(step), strict=True))
    assert not torch.equal(StepLoader(_numbered(50), 8, seed=4).rows(0), a.rows(0))


def test_epochs_reshuffle_and_drop_the_last_partial_batch() -> None:
    loader = StepLoader(_numbered(50), 8, seed=0)
    assert loader.steps_per_epoch == 6  # 50 // 8: the last 2 samples of each epoch's order are dropped
    epochs = [torch.cat([loader.rows(e * 6 + i) for i in range(6)]) for e in range(3)]
    for rows in epochs:
        assert len(rows) == 48 and len(set(rows.tolist())) == 48
    assert not torch.equal(epochs[0], epochs[1]) and not torch.equal(epochs[1], epochs[2])
    x, y = loader.batch(7)
    assert torch.equal(x[:, 0].long(), y) and torch.equal(y, loader.rows(7))


def test_resuming_at_step_k_continues_exactly() -> None:
    unbroken = StepLoader(_numbered(50), 8, seed=1)
    drawn = [unbroken.rows(s) for s in range(20)]
    resumed = StepLoader(_numbered(50), 8, seed=1)
    assert all(torch.equal(resumed.rows(s), drawn[s]) for s in range(11, 20))
    assert torch.equal(resumed.rows(2), drawn[2])  # going back to an earlier epoch is the same, too


def test_epoch_sampler_gives_the_torch_dataloader_the_same_batches() -> None:
    dataset, loader = _numbered(50), StepLoader(_numbered(50), 8, seed=2)
    sampler = EpochSampler(50, seed=2)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        torch_batches = list(DataLoader(dataset, batch_size=8, sampler=sampler, drop_last=True))
        ours = [loader.batch(epoch * loader.steps_per_epoch + i) for i in range(loader.steps_per_epoch)]
        assert len(torch_batches) == len(ours)
        for (tx, ty), (x, y) in zip(torch_batches, ours, strict=True):
            assert torch.equal(tx, x) and torch.equal(ty, y)


class _ItemByItem(Dataset[Sample]):
    """A plain map-style dataset (not a TensorDataset): read item by item and collated."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> Sample:
        return torch.full((3,), float(i)), torch.tensor(i % 4)


def test_any_map_style_dataset_is_collated() -> None:
    x, y = StepLoader(_ItemByItem(), 5, seed=0).batch(4)
    rows = StepLoader(_ItemByItem(), 5, seed=0).rows(4)
    assert x.shape == (5, 3) and torch.equal(x[:, 0].long(), rows) and torch.equal(y, rows % 4)


def test_eval_batches_cover_the_set_in_order() -> None:
    batches = list(eval_batches(_numbered(10), 4))
    assert [len(y) for _, y in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([y for _, y in batches]), torch.arange(10))


def test_batch_must_fit_the_train_set() -> None:
    with pytest.raises(UserError, match="does not fit data 'digits'"):
        make_batch(DIGITS, 2000, 0, 0, "digits")
    with pytest.raises(UserError, match="negative"):
        StepLoader(_numbered(10), 2, 0).rows(-1)


def test_timed_batch_measures_the_wait() -> None:
    batch = timed_batch(DIGITS, 16, 3, 0, "digits")
    x, y = make_batch(DIGITS, 16, 3, 0, "digits")
    assert torch.equal(batch.inputs, x) and torch.equal(batch.targets, y)
    assert 0 <= batch.wait_s < 10


# ---- user factories ----------------------------------------------------------------------------


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory; the ``pt_*`` modules written there are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("pt_")]:
        del sys.modules[name]


def _write(folder: Path, module: str, body: str) -> None:
    (folder / f"{module}.py").write_text(textwrap.dedent(body))


_FACTORY = """
    import torch
    from torch.utils.data import TensorDataset

    def make():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(40, 8, generator=g)
        return TensorDataset(x[:30], (x[:30, 0] > 0).long()), TensorDataset(x[30:], (x[30:, 0] > 0).long())

    def three():
        return make() + (None,)

    def floats():
        train, held_out = make()
        return [(x.double(), y) for x, y in train], held_out

    def numbers():
        return [(1, 2)], make()[1]

    def broken():
        raise RuntimeError("no such file: data.csv")

    NOT_CALLABLE = 3
"""


def test_user_factory_from_the_working_directory(user_dir: Path) -> None:
    _write(user_dir, "pt_data_ok", _FACTORY)
    graph = mlp_graph()  # 8 float features, 4 classes
    pair = load_datasets("pt_data_ok:make", graph)
    assert isinstance(pair, DatasetPair) and len(pair.train) == 30  # type: ignore[arg-type]
    x, y = make_batch(graph, 6, 2, 0, "pt_data_ok:make")
    assert x.shape == (6, 8) and y.shape == (6,) and y.dtype == torch.int64
    assert TrainConfig(data="pt_data_ok:make").data == "pt_data_ok:make"


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("pt_missing_module:make", r"no module 'pt_missing_module' in the working directory .* PYTHONPATH"),
        ("pt_data_err:nope", r"module 'pt_data_err' \(.*pt_data_err.py\) has no attribute 'nope'"),
        ("pt_data_err:NOT_CALLABLE", "is of type int, not callable"),
        ("pt_data_err:three", "returned a tuple; return a .train_dataset, eval_dataset. tuple"),
        ("pt_data_err:numbers", "yields a tuple of 2 .int, int.; make dataset.i. return an .input, target. pair"),
        ("pt_data_err:floats", r"\(train split\) yields inputs of shape \(8,\) float64, but model 'mlp-test' takes"),
        ("pt_data_err:broken", "raised RuntimeError: no such file: data.csv; fix the factory"),
        ("pt_data_err", "not of the form module.path:callable"),
    ],
)
def test_user_factory_errors_are_one_line(user_dir: Path, ref: str, match: str) -> None:
    _write(user_dir, "pt_data_err", _FACTORY)
    with pytest.raises(UserError, match=match) as error:
        load_datasets(ref, mlp_graph()) if ":" in ref else load_callable(ref, "data factory")
    assert "\n" not in str(error.value)


def test_a_module_in_the_working_directory_comes_first(user_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path_factory.mktemp("on_sys_path")
    _write(elsewhere, "pt_shadowed", "def where():\n    return 'sys.path'\n")
    _write(user_dir, "pt_shadowed", "def where():\n    return 'cwd'\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    assert load_callable("pt_shadowed:where", "test")() == "cwd"


def test_unknown_source_names_the_choices() -> None:
    with pytest.raises(UserError, match=r"use digits, text, synthetic, text:PATH or module\.path:callable"):
        TrainConfig(data="imagenet")
    assert TrainConfig(data="text").data == "text"


# ---- losses ------------------------------------------------------------------------------------


def test_default_loss_follows_the_target_dtype() -> None:
    assert resolve_loss(None, TensorSpec((), "int64", high=10)).kind is LossKind.CROSS_ENTROPY
    assert resolve_loss(None, TensorSpec((32,), "int64", high=256)).kind is LossKind.LM
    assert resolve_loss(None, TensorSpec((5,))).kind is LossKind.MSE
    for name in ("mlp-digits", "gpt-tiny", "gnmt-tiny", "vgg16-32", "synthetic"):
        graph = build_model(name)
        assert resolve_loss(None, graph.target).kind is graph.loss, name


def test_builtin_losses_sum_over_samples() -> None:
    output, target = torch.randn(6, 10), torch.randint(0, 10, (6,))
    loss = resolve_loss("cross-entropy", TensorSpec((), "int64"))
    assert torch.equal(loss(output, target), loss_sum(LossKind.CROSS_ENTROPY, output, target))
    assert float(loss(output, target)) == pytest.approx(6 * float(torch.nn.functional.cross_entropy(output, target)))
    mse = resolve_loss("mse", TensorSpec((10,)))
    assert float(mse(output, output + 1)) == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("name", "target", "match"),
    [
        ("mse", TensorSpec((), "int64"), "needs float targets"),
        ("cross-entropy", TensorSpec((3,)), "needs int64 class targets"),
        ("cross-entropy", TensorSpec((4, 4), "int64"), "write a module.path:callable loss"),
        ("hinge", TensorSpec((), "int64"), "use cross-entropy, next-token, mse or module.path:callable"),
        ("pt_no_such_loss:f", TensorSpec(()), "loss 'pt_no_such_loss:f': no module"),
    ],
)
def test_losses_that_do_not_fit_are_refused(name: str, target: TensorSpec, match: str) -> None:
    with pytest.raises(UserError, match=match):
        resolve_loss(name, target)


def test_user_loss_is_imported_by_name_and_pickles(user_dir: Path) -> None:
    _write(user_dir, "pt_losses", """
        def l1(output, target):
            return (output - target).abs().flatten(1).mean(dim=1).sum()

        def per_sample(output, target):
            return (output - target).abs().flatten(1).mean(dim=1)
    """)
    loss = resolve_loss("pt_losses:l1", TensorSpec((3,)))
    assert loss.kind is None and pickle.loads(pickle.dumps(loss)) == loss
    assert float(loss(torch.zeros(4, 3), torch.ones(4, 3))) == pytest.approx(4.0)
    with pytest.raises(UserError, match=r"returned shape \(4,\); return a scalar tensor, the sum over samples"):
        resolve_loss("pt_losses:per_sample", TensorSpec((3,)))(torch.zeros(4, 3), torch.ones(4, 3))


def test_builtin_sources_yield_what_the_default_loss_takes() -> None:
    for source, graph in (("digits", DIGITS), ("synthetic", DIGITS), ("text", GPT)):
        x, y = make_batch(graph, 4, 0, 0, source)
        assert resolve_loss(None, graph.target)(graph.build_sequential()(x), y).dim() == 0
