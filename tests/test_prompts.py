"""Real prompts (`--prompts FILE`): tokenized by the GGUF model's own tokenizer, refused in one line
when the model has none (llama.cpp would abort the process), and reproduced by verify --rerun."""

import json

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.cli import app

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
runner = CliRunner()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    for name, preset in (("vocab.gguf", "bench"), ("none.gguf", "dgr-012")):
        f.tiny_gguf(d / name, "q4_0", preset)
    return d


def sweep(*args):
    r = runner.invoke(app, ["sweep", "--json", "--engine", "gguf", "--threads", "1", "--warmup", "0", *map(str, args)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_text_lines_and_jsonl_give_the_same_ids(models, tmp_path):
    texts = ["hello world", "the quick brown fox", "\u00e9t\u00e9 \u2603"]
    lines, jsonl = tmp_path / "p.txt", tmp_path / "p.jsonl"
    lines.write_text("\n".join(texts) + "\n\n")
    jsonl.write_text("\n".join(json.dumps({"prompt": t, "id": i}) for i, t in enumerate(texts)))
    model = models / "vocab.gguf"
    a = sweep("--model", model, "--prompts", lines, "--sessions", 3, "--new-tokens", 3, "--levels", "1,3")
    b = sweep("--model", model, "--prompts", jsonl, "--sessions", 3, "--new-tokens", 3, "--levels", "1")
    # BOS, then the pieces: ' h' 'el' 'lo' ' w' 'or' 'ld'; the last prompt falls back to bytes.
    assert a["workload"]["prompt_tokens"] == b["workload"]["prompt_tokens"] == [7, 11, 11]
    assert a["levels"][0]["sessions"] == b["levels"][0]["sessions"] and a["corruption_free"]


def test_a_model_without_a_vocabulary_is_refused_not_aborted(models, tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("hello\n")
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        models / "none.gguf",
        "--prompts",
        p,
        "--sessions",
        1,
        "--levels",
        1,
        expect="has no tokenizer (vocabulary type none)",
    )


@pytest.mark.parametrize(
    "content,expect",
    [
        ("", "no prompts in it"),
        ("one\n", "1 prompts for 2 sessions"),
        ('{"prompt": "a"}\n{"text": "b"}\n', "line 2 is not a JSON object with a non-empty string 'prompt'"),
    ],
)
def test_bad_prompt_files_are_one_line(models, tmp_path, content, expect):
    p = tmp_path / "p.txt"
    p.write_text(content)
    run_refused(
        "sweep",
        "--engine",
        "gguf",
        "--model",
        models / "vocab.gguf",
        "--prompts",
        p,
        "--sessions",
        2,
        "--levels",
        1,
        expect=expect,
    )


def test_a_prompts_bundle_reruns_and_a_changed_file_is_caught(models, tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("hello world\nsecond prompt here\n")
    out = tmp_path / "b"
    r = runner.invoke(
        app,
        [
            "sweep",
            "--engine",
            "gguf",
            "--model",
            str(models / "vocab.gguf"),
            "--threads",
            "1",
            "--prompts",
            str(p),
            "--sessions",
            "2",
            "--new-tokens",
            "3",
            "--levels",
            "1,2",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["verify", str(out), "--rerun"]).exit_code == 0
    p.write_text("a different first prompt entirely\nsecond prompt here\n")
    r = runner.invoke(app, ["verify", str(out), "--rerun"])
    assert r.exit_code == 2 and "changed since the bundle was made" in r.output  # its sha256, before tokenizing


def _prefixed(tmp_path, lines):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines))
    return p


SYSTEM = ["you are a helpful assistant who answers briefly " * 3, "the kitchen is open from nine until five " * 3]


def test_a_shared_system_prompt_starts_each_of_its_groups_prompts_and_verifies(models, tmp_path):
    qs = ["what time is it", "where is the fox", "hello world", "the quick brown fox", "why", "how so"]
    p = _prefixed(tmp_path, [{"prefix": SYSTEM[i // 3], "prompt": q} for i, q in enumerate(qs)])
    out = tmp_path / "b"
    args = ["--model", models / "vocab.gguf", "--prompts", p, "--sessions", 6, "--new-tokens", 4, "--levels", "1,3"]
    args += ["--prefix-groups", "3,3", "--prefix-tokens", 24, "--prefix-cache", "--block-tokens", 8, "--out", out]
    d = sweep(*args)
    lv = d["levels"][0]
    # alone, in order: the second and third of each group hit the 24-id prefix (three blocks of 8)
    assert lv["prefix"]["hits"] == 4 and lv["prefix"]["saved_tokens"] == 4 * 24, lv["prefix"]
    assert d["corruption_free"] and all(x["cache_verdict"]["holds"] for x in d["levels"])
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "lines, extra, expect",
    [
        ([{"prefix": SYSTEM[0], "prompt": "a"}, {"prompt": "b"}], [], "give a 'prefix' on every line or on none"),
        ([{"prefix": "", "prompt": "a"}, {"prefix": "x", "prompt": "b"}], [], "'prefix' is not a non-empty string"),
        ([{"prefix": SYSTEM[0], "prompt": "a"}, {"prefix": SYSTEM[0], "prompt": "b"}], None, "give workload.prefix"),
        ([{"prefix": SYSTEM[0], "prompt": "a"}, {"prefix": SYSTEM[1], "prompt": "b"}], [], "texts differ"),
        ([{"prefix": "short", "prompt": "a"}, {"prefix": "short", "prompt": "b"}], [], "fewer than"),
        (["plain a", "plain b"], [], "needs JSONL lines with a 'prefix'"),
        (
            [{"prefix": SYSTEM[0], "prompt": "a"}, {"prefix": SYSTEM[0], "prompt": "b"}],
            [1, 1],
            "start with the same 24 ids",
        ),
    ],
)
def test_prefixed_prompts_that_cannot_mean_a_shared_prefix_are_refused(models, tmp_path, lines, extra, expect):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    args = ["sweep", "--engine", "gguf", "--model", models / "vocab.gguf", "--prompts", p, "--sessions", 2]
    args += ["--levels", 1, "--out", tmp_path / "o"]
    if extra is not None:
        args += ["--prefix-groups", ",".join(map(str, extra or [2])), "--prefix-tokens", 24]
    run_refused(*args, expect=expect)
