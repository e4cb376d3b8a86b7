"""A deterministic SentencePiece-style ``llama`` vocabulary for the models meshbench makes, so that
llama.cpp's own tools (llama-server, llama-cli, llama-batched-bench) load them and can tokenize text.

Ids 0, 1, 2 are <unk>, <s> (BOS) and </s> (EOS); ids 3..258 the 256 byte-fallback tokens <0x00>..<0xFF>;
the rest are generated pieces: the word-start marker (U+2581) alone, then every string over a-z of
length 1, 2, 3, ... in order, each once with the marker and once without, scored so that earlier
(shorter) pieces rank higher. A preset whose vocabulary is smaller than 259 ids cannot hold it and gets none.
"""

from __future__ import annotations

import itertools
import string

SPECIALS = ("<unk>", "<s>", "</s>")
UNK, BOS, EOS = 0, 1, 2
N_BYTES = 256
MIN_VOCAB = len(SPECIALS) + N_BYTES
WORD_START = "\u2581"
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_BYTE = 1, 2, 3, 6


def pieces(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """The tokens, their scores and their types, id by id; ValueError below MIN_VOCAB ids."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"a llama vocabulary needs at least {MIN_VOCAB} ids, the preset has {vocab_size}")
    tokens = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(N_BYTES)), WORD_START][:vocab_size]
    types = [TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL, *([TYPE_BYTE] * N_BYTES), TYPE_NORMAL][:vocab_size]
    for word in _words():
        if len(tokens) >= vocab_size:
            break
        for piece in (WORD_START + word, word):
            if len(tokens) < vocab_size:
                tokens.append(piece)
                types.append(TYPE_NORMAL)
    scores = [0.0] * MIN_VOCAB + [-float(i) for i in range(vocab_size - MIN_VOCAB)]
    return tokens, scores, types


def _words():
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(letters)
