"""The one place that loads a tokenizer (`pad`, `starve` and `profile` take
--tokenizer), so that every command reads local files only: starvecheck never
downloads. Token counts are those the model sees: special tokens added, chat messages
through the tokenizer's template.

A tokenizer that cannot be loaded, or fails on the user's text, is a `UsageError`:
one line, exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from starvecheck.inputs.dataset import Sample

TOKENIZE_BATCH = 1000

Progress = Callable[[str, int, int | None], None]


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """A transformers tokenizer from local files only: starvecheck never downloads.
    NAME is a directory holding tokenizer.json (or the files of a slow tokenizer), a
    lone tokenizer.json file, or a model name already in the local Hugging Face cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        with importing("transformers"):
            from transformers import AutoTokenizer
    except ImportError as e:
        raise UsageError("--tokenizer needs transformers: pip install 'starvecheck[text]'") from e
    if os.path.isfile(name):  # a lone tokenizer.json, as `tokenizer.save("...")` writes it
        with importing("transformers"):
            from transformers import PreTrainedTokenizerFast

        try:
            return PreTrainedTokenizerFast(tokenizer_file=name)
        except Exception as e:
            raise UsageError(f"--tokenizer {name}: not a tokenizer.json ({_why(e)})") from e
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, ... by case
        raise UsageError(
            f"--tokenizer {name}: no tokenizer found in local files (starvecheck never "
            f"downloads; pass a directory with tokenizer.json): {_why(e)}"
        ) from e


def _why(e: BaseException) -> str:
    """An exception as one short line: its class, and its message where it has one."""
    text = " ".join(str(e).split())
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def token_lengths(
    samples: Sequence[Sample],
    tokenizer: PreTrainedTokenizerBase | None,
    progress: Progress | None = None,
    batch: int = TOKENIZE_BATCH,
) -> np.ndarray:
    """Token count of each sample as the model would see it: special tokens added for
    text; chat messages through the tokenizer's chat template when it has one."""
    out = np.zeros(len(samples), np.int64)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        texts: list[str] = []
        chats: list[str] = []
        where_text: list[int] = []
        where_chat: list[int] = []
        for i, s in enumerate(chunk, start):
            if isinstance(s, int):
                out[i] = s
            elif isinstance(s, str):
                texts.append(s)
                where_text.append(i)
            elif template:
                chats.append(tokenizer.apply_chat_template(s, tokenize=False))
                where_chat.append(i)
            else:  # no template: the messages' text, one per line
                texts.append("\n".join(str(m.get("content") or "") for m in s))
                where_text.append(i)
        for where, batch_texts, special in (
            (where_text, texts, True),
            (where_chat, chats, False),  # the template already holds the special tokens
        ):
            if batch_texts:
                try:
                    ids = tokenizer(
                        batch_texts,
                        add_special_tokens=special,
                        return_attention_mask=False,
                        return_token_type_ids=False,
                        verbose=False,
                    )["input_ids"]
                except Exception as e:  # a tokenizer's own failure, on the user's text
                    raise UsageError(
                        f"--tokenizer: tokenizing samples {where[0] + 1:,} to {where[-1] + 1:,} "
                        f"failed: {_why(e)}"
                    ) from e
                out[where] = [len(x) for x in ids]
        if progress is not None:
            progress("tokenizing", min(start + batch, len(samples)), len(samples))
    return out
