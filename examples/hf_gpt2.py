"""A Hugging Face model as it is: GPT-2 (transformers' own class, random init) on a local text file.

Run from the repository root::

    python examples/hf_gpt2.py

``build()`` returns a ``GPT2LMHeadModel``, unchanged: keyword inputs, a ``ModelOutput``, the head
tied to the token embedding. pipetrain captures it with torch.export and cuts it at its blocks
(``transformer.wte``, ``transformer.wpe``, ``transformer.h.0`` … ``transformer.h.3``,
``transformer.ln_f``, ``lm_head``); the tied weight is held by both end stages and its gradients are
summed before each step. The data is ``text:README.md``: this repository's README in windows of 64
bytes (``{"input_ids", "labels"}`` per sample, the Hugging Face convention), trained with the
model's own next-token loss. The trained weights load back into the class strictly, and
``save_pretrained`` writes them as any Hugging Face checkpoint. The command line takes the same::

    pipetrain train --model examples.hf_gpt2:build --data text:README.md --context 64 --ranks 2
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

VOCAB, CONTEXT = 256, 64  # byte tokens, as text:PATH gives without a tokenizer
README = Path(__file__).resolve().parents[1] / "README.md"


def build() -> nn.Module:
    """GPT-2 of 4 blocks, width 128, 4 heads, for byte tokens: about 0.9 M parameters."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=CONTEXT,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def main() -> None:
    import pipetrain

    model = build()
    result = pipetrain.train(model, f"text:{README}?context={CONTEXT}", ranks=2, batch_size=16, steps=30,
                             optimizer="adam", lr=3e-3, eval_every=15, out="out/hf-gpt2")
    model.load_state_dict(result.state_dict, strict=True)  # the model's own names, tied weight included
    model.save_pretrained("out/hf-gpt2/model")
    print(f"loss {result.losses[0]:.3f} → {result.losses[-1]:.3f}; eval {result.final_eval.eval_loss:.3f}")


if __name__ == "__main__":
    main()
