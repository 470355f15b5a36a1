"""The training step starvecheck runs itself: profile's loop trains on it, doctor times
it on a CUDA device (stages/doctor/gpustep.py), and a trace of such a loop is read by
the phases it marks (stages/trace/).

A GPT-2 configuration from transformers, randomly initialised: nothing is downloaded.
Each step of profile's loop is five `record_function` phases, PHASES, in order.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

from starvecheck.core.signals import importing
from starvecheck.core.status import UsageError

PHASES = ("DATALOADER_WAIT", "H2D_TRANSFER", "FORWARD", "BACKWARD", "OPTIMIZER")
# (layers, heads, embedding width, vocabulary, sequence length, batch size)
MODEL_SIZES = {
    "tiny": (2, 2, 128, 4096, 128, 8),
    "small": (4, 4, 256, 8192, 256, 16),
    "base": (12, 12, 768, 50257, 1024, 8),  # GPT-2 small itself
}


def build_model(size: str, device: str, seed: int = 0) -> tuple[Any, Any]:
    """A GPT-2 of MODEL_SIZES[size], randomly initialised (seeded), in train mode on
    `device`, and its AdamW optimizer."""
    with importing("torch"):
        import torch

    try:
        with importing("transformers"):
            import transformers.utils.import_utils as transformers_imports

        # A text model needs no torchvision, but transformers imports it whenever it is
        # installed, and a torchvision built for another torch fails to import (as with
        # mosaicml-streaming's pin on a CPU-only torch). Tell transformers it is absent.
        if hasattr(transformers_imports, "_torchvision_available"):
            transformers_imports._torchvision_available = False
        with importing("transformers"), _no_compile_cache_left():
            from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise UsageError(
            "the training step needs transformers: pip install 'starvecheck[text]'"
        ) from e
    layers, heads, width, vocab, seq, _ = MODEL_SIZES[size]
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=width, n_layer=layers, n_head=heads
    )
    model = GPT2LMHeadModel(config).to(device)
    # transformers 5 leaves loss_type unset and warns on the first step ("`loss_type=None`
    # was set in the config but it is unrecognized"); name the loss it falls back to.
    model.loss_type = "ForCausalLM"
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


@contextlib.contextmanager
def _no_compile_cache_left() -> Iterator[None]:
    """Importing transformers' GPT-2 imports torch._dynamo, which makes inductor's
    compile cache directory (torchinductor_<user> in TMPDIR) and names it in
    TORCHINDUCTOR_CACHE_DIR. Nothing is compiled here, so where the directory is this
    import's (it was not there before) and still empty, it is removed again, and the
    variable unset: starvecheck leaves nothing in TMPDIR. A cache directory the user
    names, or one that was there before, is left alone."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    path = _default_cache_dir()
    made = not os.path.lexists(path)
    try:
        yield
    finally:
        # torch names the directory it made: removed only where it is the one that
        # was not there before.
        named = os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        if made and named == os.path.abspath(path):
            with contextlib.suppress(OSError):  # not empty, or not there: left alone
                os.rmdir(path)


def _default_cache_dir() -> str:
    """Where torch puts inductor's cache by default, as
    torch._inductor.runtime.cache_dir_utils.default_cache_dir says it (importing that
    imports torch._dynamo, which makes the directory)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )
