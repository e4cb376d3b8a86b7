"""Warm after a sibling: each session whose prompt starts like an earlier one's (a shared system prompt) is sent
right after that sibling, where the server's prompt cache can serve the shared part from the sibling's KV, and
its answer is compared with its cold one, margins and all. Against a real llama-server started by meshbench;
forged sibling records fail verify, and so does a bundle stripped of the pass (as if made before it)."""

from __future__ import annotations

import json
import re

import factories as f
import pytest
from typer.testing import CliRunner

from meshbench.analysis import endpoint_margins
from meshbench.cli import app

runner = CliRunner()

SYSTEM = "You are a careful assistant. Answer in one short sentence, plainly, and never repeat the question. "
OTHER = "Reply as a pirate would, in a few words, with one made-up fact about the sea and its ships. "
LINES = [SYSTEM + "What is a cat?", SYSTEM + "Where is Paris?", OTHER + "Who are you?", OTHER + "What is rain?"]


def test_a_sibling_is_the_earlier_prompt_sharing_the_most_leading_ids():
    ids = ["s0", "s1", "s2", "s3", "s4"]
    base = list(range(100, 120))  # 20 shared ids
    prompts = [base + [1], base + [2], list(range(15)) + [7], list(range(15)) + [8], base[:18] + [3]]
    # s1 shares 20 with s0; s3 shares only 15 with s2 (below 16); s4 shares 18 with s0 and s1: the latest, s1
    assert endpoint_margins.siblings(ids, prompts) == {"s1": "s0", "s4": "s1"}
    assert endpoint_margins.siblings(ids[:1], prompts[:1]) == {}


@pytest.mark.cell("llama-server", "native", "margins")
@f.needs_llama_server
def test_each_session_after_its_sibling_is_compared_with_its_cold_answer_and_verified(model, tmp_path):
    prompts = f.prompts_file(tmp_path / "p.txt", LINES)
    out = tmp_path / "SIB"
    args = ["sweep", "--serve", "llama-server", "--model", str(model), "--server-args", "-np 2 -c 1024 -t 1"]
    args += ["--prompts", str(prompts), "--sessions", "4", "--new-tokens", "4", "--levels", "1,2", "--repeat", "1"]
    r = runner.invoke(app, [*args, "--warmup", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "results.json").read_text())
    m = data["margins"]
    assert m["siblings"] == {"s1": "s0", "s3": "s2"}, m.get("siblings")
    assert [x["session_id"] for x in m["sibling"]] == ["s1", "s3"]
    for x in m["sibling"]:
        assert x["error"] is None and len(x["margins"]) == len(x["tokens"]) == 4
        assert x["computed"] < x["evaluated"]  # the server's prompt cache served the shared start
    d = data["divergences"]["sibling_differing"]
    assert isinstance(d, list) and all(x["beside"] == [m["siblings"][x["session_id"]]] for x in d)
    line = next(x for x in (out / "README.md").read_text().splitlines() if x.startswith("Right after a sibling"))
    counts = re.search(r"could give, for (\d+); more than that .* for (\d+); nothing for (\d+)", line)
    assert counts is not None and sum(map(int, counts.groups())) == 2, line  # each sibling answer classified
    ok = runner.invoke(app, ["verify", str(out)])
    assert ok.exit_code == 0, ok.output

    good = (out / "results.json").read_text()

    def forged(edit) -> str:
        doc = json.loads(good)
        edit(doc)
        (out / "results.json").write_text(json.dumps(doc))
        res = runner.invoke(app, ["verify", str(out)])
        (out / "results.json").write_text(good)
        assert res.exit_code == 1, res.output
        return res.stdout

    assert "margins.siblings (recomputed from the prompt ids)" in forged(
        lambda d: d["margins"]["siblings"].update({"s3": "s1"})
    )
    assert "margins.sibling (each session with a sibling once, in order)" in forged(
        lambda d: d["margins"]["sibling"].pop()
    )

    # a sibling answer made to differ from its cold one must show in the recomputed divergences
    def differ(d):
        x = d["margins"]["sibling"][0]
        x["tokens"][-1] = (x["tokens"][-1] + 1) % 256

    assert "divergences (recomputed" in forged(differ)
    # a bundle stripped of the sibling pass, as if made before it: not read as older, failed
    doc = json.loads(good)
    del doc["margins"]["sibling"], doc["margins"]["siblings"], doc["divergences"]["sibling_differing"]
    (out / "results.json").write_text(json.dumps(doc))
    readme = (out / "README.md").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(readme) if line.startswith("Right after a sibling"))
    (out / "README.md").write_text("".join(readme[:at] + readme[at + 2 :]))  # (the line and its blank one)
    old = runner.invoke(app, ["verify", str(out)])
    assert old.exit_code == 1 and "margins.siblings (recomputed from the prompt ids)" in old.stdout, old.output
