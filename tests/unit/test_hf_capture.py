"""Hugging Face models captured as they are (issue 26 §1): torch.export at block granularity.

Tiny configs with random init (``tests/hf_models.py``), nothing downloaded. Each model's layers,
run in order on its packed keyword inputs, give the model's own logits and gradients; the
next-token loss equals the model's own ``loss`` from ``labels``; the weights keep the model's names.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from pipetrain.api import resolve_model
from pipetrain.cli.main import _parse
from pipetrain.data import EvalTally, data_specs, load_datasets, resolve_loss
from pipetrain.data.fields import FieldsDataset
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import Field, LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.graph.packing import pack
from tests import hf_models

pytest.importorskip("transformers")

BLOCKS = tuple(range(4))
CASES = {
    "llama": ("tests.hf_models:llama", "tests.hf_models:causal_masked_data",
              ("model.embed_tokens", *(f"model.layers.{i}" for i in BLOCKS), "model.norm", "lm_head")),
    "qwen2": ("tests.hf_models:qwen2", "tests.hf_models:causal_data",
              ("model.embed_tokens", *(f"model.layers.{i}" for i in BLOCKS), "model.norm", "lm_head")),
    "gpt2": ("tests.hf_models:gpt2_untied", "tests.hf_models:causal_data",
             ("transformer.wte", "transformer.wpe", *(f"transformer.h.{i}" for i in BLOCKS), "transformer.ln_f",
              "lm_head")),
    "bert": ("tests.hf_models:bert", "tests.hf_models:classification_data",
             ("bert.embeddings", *(f"bert.encoder.layer.{i}" for i in BLOCKS), "bert.pooler", "classifier")),
}


@pytest.fixture(scope="module")
def graphs() -> dict[str, LayerGraph]:
    return {name: resolve_model(model, data=data) for name, (model, data, _) in CASES.items()}


def _model(name: str) -> nn.Module:
    factory = getattr(hf_models, CASES[name][0].split(":")[1])
    return factory()  # type: ignore[no-any-return]


def _batch(name: str, n: int = 5) -> dict[str, torch.Tensor]:
    data = getattr(hf_models, CASES[name][1].split(":")[1])()[0]
    return {key: torch.stack([data[i][key] for i in range(n)]) for key in data[0]}


def _run_layers(graph: LayerGraph, batch: dict[str, torch.Tensor], train: bool = False) -> tuple[
        torch.Tensor, list[nn.Module]]:
    layers = [graph.build_layer(i).train(train) for i in range(len(graph))]
    h = pack([batch[field.name] for field in graph.input.fields])
    for layer in layers:
        h = layer(h)
    return h, layers


@pytest.mark.parametrize("name", list(CASES))
def test_a_model_is_cut_at_its_blocks_and_reads_its_keyword_inputs(graphs: dict[str, LayerGraph], name: str) -> None:
    graph = graphs[name]
    assert graph.names == CASES[name][2]
    assert graph.input.fields[0] == Field("input_ids", (hf_models.T,), "int64")
    assert graph.loss is (LossKind.CROSS_ENTROPY if name == "bert" else LossKind.CAUSAL_LM)


@pytest.mark.parametrize("name", list(CASES))
def test_layers_in_order_give_the_models_logits_and_gradients(graphs: dict[str, LayerGraph], name: str) -> None:
    graph, model, batch = graphs[name], _model(name).eval(), _batch(name)
    out, layers = _run_layers(graph, batch)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    expected = model(**inputs).logits
    assert torch.allclose(out, expected, atol=1e-6, rtol=1e-5)
    out.square().mean().backward()
    expected.square().mean().backward()
    grads = {k: p.grad for layer in layers for k, p in layer.named_parameters() if p.grad is not None}
    for key, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[key], p.grad, atol=1e-6, rtol=1e-4), key


@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2"])
def test_the_next_token_loss_is_the_models_own_loss(graphs: dict[str, LayerGraph], name: str) -> None:
    graph, model, batch = graphs[name], _model(name).eval(), _batch(name)
    out, _ = _run_layers(graph, batch)
    ours = loss_sum(graph.loss, out, batch["labels"]) / len(out)
    assert torch.allclose(ours, model(**batch).loss, rtol=1e-6)


def test_the_next_token_loss_ignores_masked_labels_per_sample() -> None:
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[1, 2, 3, 4, 5], [1, 2, -100, -100, -100]]) % 7
    labels[1, 2:] = -100
    per_token = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="none",
                                            ignore_index=-100).view(2, 4)
    expected = per_token[0].mean() + per_token[1, :1].mean()
    assert torch.allclose(loss_sum(LossKind.CAUSAL_LM, logits, labels), expected)


@pytest.mark.parametrize("name", list(CASES))
def test_weights_keep_the_models_names_and_load_strictly(graphs: dict[str, LayerGraph], name: str) -> None:
    graph, model = graphs[name], _model(name)
    keys = {k for i in range(len(graph)) for k in graph.build_layer(i).state_dict()}
    assert keys == set(model.state_dict())
    model.load_state_dict(graph.build_module().state_dict(), strict=True)


def test_dropout_runs_in_training_and_not_in_evaluation() -> None:
    model = hf_models.gpt2(dropout=0.5, tied=False)
    graph = resolve_model(model, data="tests.hf_models:causal_data", name="gpt2-dropout")
    batch = _batch("gpt2")
    evaluated, _ = _run_layers(graph, batch)
    assert torch.allclose(evaluated, model.eval()(input_ids=batch["input_ids"]).logits, atol=1e-6)
    first, _ = _run_layers(graph, batch, train=True)
    second, _ = _run_layers(graph, batch, train=True)
    assert not torch.allclose(first, second) and not torch.allclose(first, evaluated)


def test_layers_pickle_run_anywhere_and_on_the_meta_device(graphs: dict[str, LayerGraph]) -> None:
    graph, batch = graphs["llama"], _batch("llama")
    h = g = pack([batch[f.name] for f in graph.input.fields])
    for i, layer in enumerate(graph.layers):
        h = graph.build_layer(i).eval()(h)
        g = pickle.loads(pickle.dumps(layer)).build().eval()(g)  # rebuilt by tracing its code again
    assert torch.equal(h, g)
    specs = graph.output_specs()  # on the meta device: the code's cpu arguments follow the inputs
    assert specs[-1].shape == (hf_models.T, hf_models.VOCAB)


# ---- data ------------------------------------------------------------------------------------


def test_dict_items_become_packed_samples_with_their_layout() -> None:
    train, _ = hf_models.classification_data()
    dataset = FieldsDataset(train, "data")
    assert dataset.fields == (Field("input_ids", (16,)), Field("attention_mask", (16,)))
    x, y = dataset[3]
    assert torch.equal(x, torch.cat([train[3]["input_ids"], train[3]["attention_mask"]])) and y == train[3]["labels"]


def test_dict_items_without_labels_say_how_to_fix_it() -> None:
    with pytest.raises(UserError, match=r"without 'labels'.*add the target under 'labels'"):
        FieldsDataset([{"input_ids": torch.zeros(4, dtype=torch.long)}], "data 'x'")  # type: ignore[arg-type]


def test_a_text_file_trains_a_causal_lm_in_windows(tmp_path: Path, graphs: dict[str, LayerGraph]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("pipelines cut models into stages. " * 40)
    source = f"text:{path}?context=16&tokenizer=tests.hf_models:char_tokenizer"
    graph = resolve_model("tests.hf_models:llama", data=source)
    assert graph.input.fields == (Field("input_ids", (16,)),) and graph.loss is LossKind.CAUSAL_LM
    pair = load_datasets(source, graph)
    x, y = pair.train[1]
    assert torch.equal(x, y) and x.tolist() == [ord(c) % 128 for c in ("pipelines cut models into stages. " * 2)[16:32]]
    assert len(pair.train) == 1360 * 9 // 10 // 16 and len(pair.eval) >= 1  # type: ignore[arg-type]


def test_a_text_file_without_a_tokenizer_is_bytes_and_errors_name_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("ab" * 100)
    from pipetrain.data.text_file import text_file_pair

    train, _ = text_file_pair(f"text:{path}?context=8")
    assert train[0]["input_ids"].tolist() == [97, 98] * 4
    with pytest.raises(UserError, match=r"cannot read .*give the path of a UTF-8 text file"):
        text_file_pair(f"text:{tmp_path / 'missing.txt'}")
    with pytest.raises(UserError, match=r"too few for a window of 512.*smaller context"):
        text_file_pair(f"text:{path}?context=512")
    with pytest.raises(UserError, match="unknown option size"):
        text_file_pair(f"text:{path}?size=3")


def test_a_plain_module_takes_a_one_field_text_file_as_its_tensor(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello pipelines " * 200)
    model = nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 256))
    graph = resolve_model(model, data=f"text:{path}?context=16", name="bytes-lm")
    assert graph.input.fields == () and graph.input.shape == (16,) and graph.loss is LossKind.CAUSAL_LM


def test_loss_names_include_next_token() -> None:
    input, target = data_specs("tests.hf_models:causal_data", "m")
    assert input.fields and target == TensorSpec((16,), "int64", high=hf_models.VOCAB)
    assert resolve_loss(None, target, input).name == "next-token"
    assert resolve_loss("cross-entropy", target, input).kind is LossKind.LM
    with pytest.raises(UserError, match="'next-token' takes int64 token targets"):
        resolve_loss("next-token", TensorSpec((), "int64"))


def test_next_token_accuracy_scores_the_following_target_and_skips_ignored_ones() -> None:
    labels = torch.tensor([[3, 1, 4, 1, 5], [2, 7, 1, 8, -100]])
    logits = torch.nn.functional.one_hot(labels.roll(-1, dims=1).clamp(min=0), 9).float()  # position t → label t+1
    logits[0, 0] = torch.nn.functional.one_hot(torch.tensor(0), 9).float()  # one wrong prediction
    tally = EvalTally()
    tally.add(resolve_loss("next-token", TensorSpec((5,), "int64")), logits, labels)
    result = tally.result()
    assert result.accuracy == pytest.approx(6 / 7)  # 4 + 3 counted targets, one wrong


def test_the_command_line_folds_tokenizer_and_context_into_the_text_file() -> None:
    args = _parse(["train", "--data", "text:notes.txt", "--context", "32", "--tokenizer", "my_tok:load"])
    assert args.data == "text:notes.txt?context=32&tokenizer=my_tok:load"
    with pytest.raises(SystemExit):
        _parse(["train", "--data", "digits", "--context", "32"])


# ---- errors that fix -------------------------------------------------------------------------


class SignedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if h.sum() > 0:  # a Python branch on a value: neither export nor fx can capture it
            return self.fc(h)
        return -self.fc(h)


class KeywordModel(nn.Module):
    """Takes ``input_ids`` by keyword, like a Hugging Face model, and branches on values in a block."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList([SignedBlock(), SignedBlock()])
        self.head = nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_an_export_failure_is_one_line_whose_remedies_lead_to_a_running_model() -> None:
    from pipetrain.graph.load import capture_module

    ids, target = TensorSpec((4,), "int64", high=16), TensorSpec((4,), "int64", high=16)
    with_fields = TensorSpec((4,), "int64", high=16, fields=(Field("input_ids", (4,)),))
    ids_and_mask = TensorSpec((8,), "int64", high=16, fields=(Field("input_ids", (4,)), Field("mask", (4,))))
    with pytest.raises(UserError, match=r"model 'k' has no forward input 'mask' that the data gives; drop"):
        capture_module(KeywordModel(), input=ids_and_mask, target=target, loss=LossKind.CAUSAL_LM, name="k")
    with pytest.raises(UserError) as error:  # one field the forward takes by name: torch.export
        capture_module(KeywordModel(), input=with_fields, target=target, loss=LossKind.CAUSAL_LM, name="k")
    text = str(error.value)
    assert "\n" not in text and "torch.export cannot capture 'k' at test_hf_capture.py:" in text
    assert "`if h.sum() > 0:" in text and "(input, target) tensor pairs" in text
    with pytest.raises(UserError) as error:  # followed: tensor pairs, so torch.fx, which names the leaf
        capture_module(KeywordModel(), input=ids, target=target, loss=LossKind.CAUSAL_LM, name="k")
    leaf = re.search(r"--leaf (\S+?)\)?[,;]", str(error.value))
    assert leaf is not None and leaf.group(1).endswith(":SignedBlock")
    graph = capture_module(KeywordModel(), input=ids, target=target, loss=LossKind.CAUSAL_LM, name="k",
                           leaf_modules=[leaf.group(1)])  # followed again: it runs
    assert graph.names == ("embed", "blocks.0", "blocks.1", "head")


class NormedKeywordModel(nn.Module):
    """A keyword-input model with a BatchNorm, whose forward updates its running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Embedding(16, 8), nn.BatchNorm1d(4), nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(input_ids)))


def test_a_keyword_models_batch_norm_trains_and_evaluates_as_the_module_does() -> None:
    from pipetrain.graph.load import capture_module

    model = NormedKeywordModel()
    spec = TensorSpec((4,), "int64", high=16, fields=(Field("input_ids", (4,)),))
    graph = capture_module(model, input=spec, target=TensorSpec((4,), "int64", high=16), loss=LossKind.CAUSAL_LM,
                           name="n")  # torch.export: the batch_norm op becomes the module again
    assert graph.names == ("embed", "norm", "head")
    layers = [graph.build_layer(i) for i in range(3)]
    ids = torch.randint(0, 16, (6, 4))
    for _ in range(2):  # training: batch statistics, running statistics updated as the module's
        h = ids
        for layer in layers:
            h = layer(h)
        assert torch.allclose(h, model(ids), atol=1e-6)
    norm = layers[1].get_submodule("norm")
    for key, value in model.norm.state_dict().items():
        assert torch.allclose(norm.state_dict()[key], value), key
    h = ids
    for layer in layers:
        h = layer.eval()(h)
    assert torch.allclose(h, model.eval()(ids), atol=1e-6)  # evaluation: the running statistics


def test_a_hugging_face_model_fed_one_tensor_takes_it_as_its_first_input() -> None:
    from pipetrain.graph.load import capture_module

    tokens = TensorSpec((hf_models.T,), "int64", high=hf_models.VOCAB)
    graph = capture_module(hf_models.llama(), input=tokens, target=tokens, loss=LossKind.LM, name="llama")
    assert graph.input.fields == (Field("input_ids", (hf_models.T,)),) and graph.names[1] == "model.layers.0"
    ids = _batch("llama")["input_ids"]
    out, _ = _run_layers(graph, {"input_ids": ids})
    assert torch.allclose(out, hf_models.llama().eval()(input_ids=ids).logits, atol=1e-6)


def test_token_ids_past_the_vocabulary_name_the_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("caf\u00e9 au lait " * 40)  # é is the bytes 195, 169: past a vocabulary of 128
    with pytest.raises(UserError, match=r"token ids reach 195 but model 'tests.hf_models:llama' has a vocabulary "
                                        r"of 128; tokenise with the model's tokenizer \(--tokenizer"):
        resolve_model("tests.hf_models:llama", data=f"text:{path}?context=16")
    tokenised = f"text:{path}?context=16&tokenizer=tests.hf_models:char_tokenizer"
    graph = resolve_model("tests.hf_models:llama", data=tokenised)
    assert graph.input.high is not None and graph.input.high <= hf_models.VOCAB  # followed: it captures
