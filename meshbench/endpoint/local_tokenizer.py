"""The tokenizer of a model a server names by a path on this machine, loaded here with transformers (the
``transformers`` extra), offline: how meshbench tokenizes for a server that serves no tokenizer of its own but
loads its model from a local file (``transformers serve``: ``FOLDER:FILE.gguf``, or a folder), and only for a
server on this machine (loopback): a path a server off it names is not read.

It is the same library and the same file the server reads, so the ids are the server's; each answer's ``usage``
(its prompt_tokens) is held to them by verify."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from meshbench.errors import MeshbenchError

OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def where(model_id: str) -> tuple[Path, str | None]:
    """The folder and the GGUF file (None: a folder of its own) a model id names."""
    folder, colon, file = model_id.rpartition(":")
    if colon and file.endswith(".gguf"):
        return Path(folder), file
    return Path(model_id), None


@lru_cache(maxsize=4)
def _tokenizer(model_id: str) -> Any:
    folder, file = where(model_id)
    found = (folder / file).is_file() if file else folder.is_dir()
    if not found:
        raise MeshbenchError(
            f"the server serves {model_id!r:.200}, no model file on this machine: meshbench tokenizes for it with "
            "the model's own tokenizer, which it reads from that file"
        )
    for name in OFFLINE:
        os.environ[name] = "1"  # (before transformers and huggingface_hub read it: nothing is fetched)
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 - an optional extra
    except ImportError:
        raise MeshbenchError("tokenizing for this server needs transformers: pip install 'meshbench[transformers]'")
    try:
        if file:
            return AutoTokenizer.from_pretrained(str(folder), gguf_file=file, local_files_only=True)
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a file of any shape: its reader's every failure is the input's
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise MeshbenchError(f"{model_id!r:.200}: transformers cannot read its tokenizer ({why})") from None


def tokenize(model_id: str, texts: list[str], add_special: bool) -> list[list[int]]:
    """Each text's ids by the model's own tokenizer (``add_special``: the special tokens it adds, a BOS say)."""
    tok = _tokenizer(model_id)
    return [list(tok(text, add_special_tokens=add_special)["input_ids"]) for text in texts]
