"""Greedy sampling with end-of-generation ids banned: the banned ids masked in place and put back, with the token and
margin of a masked copy, bit for bit, and the row given back as it came (it may be llama.cpp's own buffer)."""

import numpy as np
import pytest

from meshbench.engine.base import EngineFault, greedy_step


def reference(row: np.ndarray, banned: np.ndarray | None) -> tuple[int, float, int | None]:
    """The masked copy greedy_step used to make, and its second choice: the lowest id of the largest of the rest."""
    x = row.copy()
    if banned is not None:
        x[banned] = -np.inf
    tok = int(np.argmax(x))
    rest = x.copy()
    rest[tok] = -np.inf
    second = int(np.argmax(rest))
    if rest[second] == -np.inf:
        return tok, float("inf"), None
    return tok, float(x[tok] - rest[second]), second


def _got(out) -> tuple[int, float, int | None]:
    return out.token, out.margin, out.runner_up


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
    assert _got(out) == reference(given, banned)
    assert out.runner_up != out.token and out.runner_up not in banned.tolist()
    assert out.token not in banned.tolist()
    assert np.array_equal(row, given)  # put back, bit for bit
    assert _got(greedy_step("s", row)) == reference(given, None)


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


def test_the_second_choice_is_the_lowest_id_of_a_tie_and_none_where_every_other_id_is_banned():
    assert _got(greedy_step("s", np.array([1.0, 3.0, 2.0, 2.0]))) == (1, 1.0, 2)  # tied runner-ups: the lowest id
    assert _got(greedy_step("s", np.array([2.0, 2.0, 1.0]))) == (0, 0.0, 1)  # a tie for the top: the lowest wins
    assert _got(greedy_step("s", np.array([3.0, 1.0, 2.0]))) == (0, 1.0, 2)  # the second after the token
    assert _got(greedy_step("s", np.array([1.0, 2.0, 3.0]))) == (2, 1.0, 1)  # the second before it
    assert _got(greedy_step("s", np.array([5.0]))) == (0, float("inf"), None)
    assert _got(greedy_step("s", np.array([5.0, 3.0]), np.array([1]))) == (0, float("inf"), None)
    assert _got(greedy_step("s", np.array([5.0, 3.0, 4.0]), np.array([0]))) == (2, 1.0, 1)


def test_each_token_s_second_choice_reaches_the_session_alike_in_process_and_from_an_engine_in_its_own_process(
    tmp_path,
):
    """engine -> scheduler -> session, and through the process child's result tuple (engine.isolate)."""
    from meshbench.hunt.node import NodeServer
    from meshbench.records.history import Request

    isolated = tmp_path / "iso.yaml"
    isolated.write_text("levels: [1, 4]\nengine:\n  kind: synthetic\n  preset: dgr-012\n  isolate: true\n")
    requests = [Request(name=f"r{k}", prompt=tuple(range(3 + k, 40 + k)), new_tokens=6) for k in range(4)]
    runs = []
    for config in ("configs/dgr-012.yaml", str(isolated)):
        with NodeServer(config) as node:
            got = node.target.at_once(requests)
        runs.append({k: (x.tokens, x.runner_up, x.margins) for k, x in got.items()})
    assert runs[0] == runs[1]
    for tokens, second, margins in runs[0].values():
        assert len(second) == len(tokens) == 6 and None not in second
        assert all(t != s for t, s in zip(tokens, second)) and all(m > 0 for m in margins)
