"""``text:PATH``: causal language modelling on a local text file, no download.

    text:notes.txt                                  bytes as tokens, windows of 128
    text:notes.txt?context=64                       windows of 64 tokens
    text:notes.txt?tokenizer=my_tok:load            tokens from the model's tokenizer

The file is read as UTF-8 and tokenised once per process: by the tokenizer a zero-argument
``module.path:callable`` returns (a Hugging Face tokenizer, anything with ``encode(text) -> ids``,
or a function ``text -> ids``), else as its bytes (ids in ``[0, 256)``, so the model's vocabulary
must have at least 256 entries). As for the built-in ``text`` data, the first 90% of the tokens are
train and the last 10% eval, each cut into windows of ``context`` tokens, ``context`` apart. Each
sample is a dict in the Hugging Face convention, the labels being the inputs (the model, or
pipetrain's ``next-token`` loss, shifts them)::

    {"input_ids": [T] int64, "labels": [T] int64}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import torch
from torch.utils.data import Dataset

from pipetrain.callables import load_callable
from pipetrain.errors import UserError

__all__ = ["PREFIX", "TextFile", "is_text_file", "text_file_pair", "with_options"]

PREFIX = "text:"
DEFAULT_CONTEXT = 128
EVAL_FRACTION = 0.1


def is_text_file(source: str) -> bool:
    """Whether ``source`` names a local text file (``text:PATH``); checked before ``module:callable``."""
    return source.startswith(PREFIX) and len(source) > len(PREFIX)


def with_options(source: str, *, context: int | None = None, tokenizer: str | None = None) -> str:
    """``source`` (``text:PATH[?...]``) with the options given (not None) set: the command line's
    ``--context`` and ``--tokenizer``."""
    path, _, query = source.partition("?")
    options = {key: values[-1] for key, values in parse_qs(query).items()}
    options |= {k: str(v) for k, v in (("context", context), ("tokenizer", tokenizer)) if v is not None}
    return f"{path}?{'&'.join(f'{k}={v}' for k, v in options.items())}" if options else path


@dataclass(frozen=True)
class TextFile:
    """A parsed ``text:PATH[?context=T&tokenizer=module:callable]``."""

    path: Path
    context: int = DEFAULT_CONTEXT
    tokenizer: str | None = None

    @classmethod
    def parse(cls, source: str) -> TextFile:
        """Raises UserError: an option other than context and tokenizer, or a context below 1."""
        path, _, query = source.removeprefix(PREFIX).partition("?")
        options = {key: values[-1] for key, values in parse_qs(query).items()}
        unknown = sorted(set(options) - {"context", "tokenizer"})
        if unknown:
            raise UserError(f"data {source!r}: unknown option {', '.join(unknown)}; "
                            "use context=T and tokenizer=module:fn")
        context = options.get("context", str(DEFAULT_CONTEXT))
        if not context.isdigit() or int(context) < 1:
            raise UserError(f"data {source!r}: context must be a positive number of tokens, not {context!r}")
        return cls(Path(path), int(context), options.get("tokenizer"))


@functools.lru_cache(maxsize=4)
def text_file_pair(source: str) -> tuple[Dataset[Mapping[str, torch.Tensor]], Dataset[Mapping[str, torch.Tensor]]]:
    """Train and eval windows of the file ``source`` names (read and tokenised once per process).

    Raises:
        UserError: a missing or unreadable file, a tokenizer that fails, or too little text for one
            window in each split.
    """
    spec = TextFile.parse(source)
    try:
        text = spec.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"data {source!r}: cannot read {str(spec.path)!r} ({error.__class__.__name__}: {error}); "
                        "give the path of a UTF-8 text file") from None
    tokens = _tokens(text, spec.tokenizer, source)
    cut = len(tokens) - int(len(tokens) * EVAL_FRACTION)
    train, held_out = _Windows(tokens[:cut], spec.context), _Windows(tokens[cut:], spec.context)
    if len(train) == 0 or len(held_out) == 0:
        raise UserError(f"data {source!r}: {len(tokens)} tokens are too few for a window of {spec.context} in both "
                        "the train and the eval part; use a longer file or a smaller context (?context=T)")
    return train, held_out


def _tokens(text: str, tokenizer: str | None, source: str) -> torch.Tensor:
    """``[n]`` int64 token ids of ``text``."""
    if tokenizer is None:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)
    made = load_callable(tokenizer, "tokenizer")()
    try:
        ids: Any = made.encode(text) if hasattr(made, "encode") else made(text)
    except Exception as error:
        raise UserError(f"data {source!r}: tokenizer {tokenizer!r} failed ({type(error).__name__}: {error}); "
                        "give a tokenizer whose encode(text) returns token ids") from None
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    if not isinstance(ids, Sequence | torch.Tensor) or len(ids) == 0:
        raise UserError(f"data {source!r}: tokenizer {tokenizer!r} returned {type(ids).__name__}; return a list "
                        "of token ids")
    return torch.as_tensor(ids, dtype=torch.int64).flatten()


class _Windows(Dataset[Mapping[str, torch.Tensor]]):
    """Windows of ``context`` tokens, ``context`` apart, as Hugging Face dict items."""

    def __init__(self, tokens: torch.Tensor, context: int) -> None:
        self.windows = tokens[: len(tokens) // context * context].view(-1, context)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> Mapping[str, torch.Tensor]:
        window = self.windows[i]
        return {"input_ids": window, "labels": window}
