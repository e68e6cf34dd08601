"""Tiny Hugging Face models (configs, random init: nothing downloaded) and dict data for them.

Factories that tests, the README and the CLI name as ``module.path:callable``::

    pipetrain train --model tests.hf_models:llama --data tests.hf_models:causal_data --ranks 2

Dropout is off in the ``*_exact`` variants so that pipelined training can equal plain torch.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

VOCAB, T, WIDTH = 128, 16, 32
SAMPLES, HELD_OUT = 96, 32


def gpt2(dropout: float = 0.0, tied: bool = True) -> torch.nn.Module:
    """GPT-2 of 4 blocks, width 32; the head tied to the token embedding unless ``tied=False``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=WIDTH, n_head=2, vocab_size=VOCAB, n_positions=T,
                                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                      tie_word_embeddings=tied))


def gpt2_untied() -> torch.nn.Module:
    return gpt2(tied=False)


def llama() -> torch.nn.Module:
    """Llama of 4 decoder layers, width 32, grouped-query attention (2 heads, 1 KV head), rotary positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, hidden_size=WIDTH, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                        max_position_embeddings=T, tie_word_embeddings=False))


def qwen2() -> torch.nn.Module:
    """Qwen2 of 4 decoder layers (another decoder family: biases on q/k/v)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=4, hidden_size=WIDTH, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                        max_position_embeddings=T, tie_word_embeddings=False))


def bert() -> torch.nn.Module:
    """BERT for 3-way sequence classification, 4 encoder layers, width 32, no dropout."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(num_hidden_layers=4, hidden_size=WIDTH, intermediate_size=64,
                                                    num_attention_heads=2, vocab_size=VOCAB, num_labels=3,
                                                    max_position_embeddings=T, hidden_dropout_prob=0.0,
                                                    attention_probs_dropout_prob=0.0))


class _Items(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {key: column[i] for key, column in self.columns.items()}


def _split(columns: dict[str, torch.Tensor]) -> tuple[_Items, _Items]:
    return (_Items({k: v[:SAMPLES] for k, v in columns.items()}),
            _Items({k: v[SAMPLES:] for k, v in columns.items()}))


def causal_data() -> tuple[_Items, _Items]:
    """Token sequences that repeat a random 4-token motif (learnable): ``input_ids``, ``labels`` = the ids."""
    generator = torch.Generator().manual_seed(1)
    motifs = torch.randint(0, VOCAB, (SAMPLES + HELD_OUT, 4), generator=generator)
    ids = motifs.repeat(1, T // 4)
    return _split({"input_ids": ids, "labels": ids})


def causal_masked_data() -> tuple[_Items, _Items]:
    """:func:`causal_data` with an ``attention_mask`` of ones (a data-dependent mask crosses every cut)."""
    train, held_out = causal_data()
    return tuple(_Items({"input_ids": d.columns["input_ids"], "attention_mask": torch.ones_like(d.columns["input_ids"]),
                         "labels": d.columns["labels"]}) for d in (train, held_out))  # type: ignore[return-value]


def classification_data() -> tuple[_Items, _Items]:
    """Padded sequences (``attention_mask`` 0 past a random length) whose class is the first token mod 3."""
    generator = torch.Generator().manual_seed(2)
    n = SAMPLES + HELD_OUT
    ids = torch.randint(1, VOCAB, (n, T), generator=generator)
    lengths = torch.randint(T // 2, T + 1, (n,), generator=generator)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return _split({"input_ids": ids * mask, "attention_mask": mask, "labels": ids[:, 0] % 3})


def char_tokenizer() -> object:
    """A tokenizer factory for ``text:PATH?tokenizer=tests.hf_models:char_tokenizer``: ids = code points mod 128."""
    return lambda text: [ord(c) % VOCAB for c in text]
