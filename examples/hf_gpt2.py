"""A Hugging Face model as it is: GPT-2 (transformers' own class, random init) on a local text file.

``build()`` returns a ``GPT2LMHeadModel``, unchanged: keyword inputs, a ``ModelOutput``, the head
tied to the token embedding. pipetrain captures it with torch.export and cuts it at its blocks
(``transformer.wte``, ``transformer.wpe``, ``transformer.h.0`` … ``transformer.h.3``,
``transformer.ln_f``, ``lm_head``); the tied weight is held by both end stages and its gradients are
summed before each step. The data is ``text:README.md``: this repository's README in windows of 64
bytes (``{"input_ids", "labels"}`` per sample, the Hugging Face convention), trained with the
model's own next-token loss. The trained weights load back into the class strictly, and
``save_pretrained`` writes them as any Hugging Face checkpoint (the README's "Train a Hugging Face
model" does it in Python). From the repository root::

    pipetrain train --model examples.hf_gpt2:build --data text:README.md --context 64 --ranks 2
"""

from __future__ import annotations

from torch import nn

VOCAB, CONTEXT = 256, 64  # byte tokens, as text:PATH gives without a tokenizer


def build() -> nn.Module:
    """GPT-2 of 4 blocks, width 128, 4 heads, for byte tokens: about 0.9 M parameters."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)
