"""Greedy sampling with end-of-generation ids banned: the banned ids masked in place and put back, with the token and
margin of a masked copy, bit for bit, and the row given back as it came (it may be llama.cpp's own buffer)."""

import numpy as np
import pytest

from meshbench.engine.base import EngineFault, greedy_step


def reference(row: np.ndarray, banned: np.ndarray | None) -> tuple[int, float]:
    """The masked copy greedy_step used to make."""
    x = row.copy()
    if banned is not None:
        x[banned] = -np.inf
    tok = int(np.argmax(x))
    second = max(x[:tok].max(initial=-np.inf), x[tok + 1 :].max(initial=-np.inf))
    return tok, float(x[tok] - second)


@pytest.mark.parametrize("seed", range(40))
def test_banned_ids_give_the_masked_copy_s_token_and_margin_and_the_row_back(seed):
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(97).astype(np.float32)
    banned = np.unique(rng.integers(0, 97, size=int(rng.integers(1, 4))))
    if seed % 4 == 0:
        row[banned[0]] = row.max() + 1  # a banned id wins the argmax
    if seed % 4 == 1:
        row[banned] = row.max()  # banned ids tied with the best of the rest
        row[int(rng.integers(0, 97))] = row.max()
    if seed % 4 == 2:
        banned = np.concatenate([banned, banned])  # the same id twice
    given = row.copy()
    out = greedy_step("s", row, banned)
    assert (out.token, out.margin) == reference(given, banned)
    assert out.token not in banned.tolist()
    assert np.array_equal(row, given)  # put back, bit for bit
    assert (greedy_step("s", row).token, greedy_step("s", row).margin) == reference(given, None)


def test_a_read_only_row_is_not_written_and_non_finite_logits_are_a_fault():
    row = np.arange(8, dtype=np.float32)
    row.flags.writeable = False
    out = greedy_step("s", row, np.array([7]))
    assert (out.token, out.margin) == (6, 1.0)
    shared = np.lib.stride_tricks.as_strided(np.array([2.0, 5.0], np.float32), (4,), (0,))  # one value four times
    assert (greedy_step("s", shared, [0]).token, greedy_step("s", shared, (0,)).margin) == (1, 0.0)
    assert np.array_equal(shared, [2.0] * 4)
    bad = np.arange(8, dtype=np.float32)
    bad[3] = np.nan
    with pytest.raises(EngineFault, match="non-finite logits: 1 of 8"):
        greedy_step("s", bad, np.array([7]))
