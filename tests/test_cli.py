"""The CLI through Typer's CliRunner: exit codes, output, bundles, verify and tampering."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshbench import __version__
from meshbench.cli import app
from meshbench.results import document as results
from meshbench.results import kinds

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b") / "DGR-012"
    r = invoke("sweep", "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def copy_of(bundle_dir, tmp_path):
    def make() -> Path:
        dst = tmp_path / "copy"
        shutil.copytree(bundle_dir, dst)
        return dst

    return make


def _edit(path: Path, fn) -> None:
    data = json.loads((path / "results.json").read_text())
    fn(data)
    (path / "results.json").write_text(json.dumps(data))


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"meshbench {__version__}"


DGR012_TABLE = [  # concurrency, ticks, avg occupancy, max occupancy, tokens/tick, peak KV bytes
    ["1", "64", "1.000", "1", "1.375", "15360"],
    ["2", "33", "1.750", "2", "2.667", "29184"],
    ["4", "19", "3.111", "4", "4.632", "52224"],
    ["8", "15", "4.000", "7", "5.867", "75264"],
]


def test_default_sweep_prints_the_dgr012_table():
    r = invoke("sweep")
    assert r.exit_code == 0, r.output
    rows = [line.strip("│ ").split("│") for line in r.stdout.splitlines() if line.startswith("│")]
    assert [[c.strip() for c in row[:6]] for row in rows] == DGR012_TABLE
    verdicts = "corruption_free=True batch_invariant=True isolation=True (4 of 4 levels) saturation_concurrency=8"
    assert verdicts in r.stdout


def test_default_sweep_json_holds_the_dgr012_figures_exactly():
    r = invoke("sweep", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    got = [
        [
            lv["concurrency"],
            lv["ticks"],
            lv["avg_batch_occupancy"],
            lv["max_batch_occupancy"],
            lv["tokens_per_tick"],
            lv["peak_kv_bytes"],
        ]
        for lv in data["levels"]
    ]
    assert got == [
        [1, 64, 1.0, 1, 88 / 64, 15360],
        [2, 33, 1.75, 2, 88 / 33, 29184],
        [4, 19, 28 / 9, 4, 88 / 19, 52224],
        [8, 15, 4.0, 7, 88 / 15, 75264],
    ]
    assert (data["corruption_free"], data["saturation_concurrency"]) == (True, 8)


def test_sweep_json_carries_results_and_nothing_else():
    r = invoke("sweep", "--levels", "1,2", "--sessions", "2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert kinds.schema_errors(data) == []
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert data["workload"]["sessions"] == 2


def test_flags_override_config_which_overrides_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload: {sessions: 4, new_tokens: 3}\nlevels: [1, 4]\n")
    data = json.loads(invoke("sweep", "--config", cfg, "--json").stdout)
    assert data["workload"]["new_tokens"] == [3, 3, 3, 3] and data["config"]["levels"] == [1, 4]
    data = json.loads(invoke("sweep", "--config", cfg, "--levels", "1,2", "--new-tokens", "2,3,4,5", "--json").stdout)
    assert data["workload"]["new_tokens"] == [2, 3, 4, 5] and data["config"]["levels"] == [1, 2]
    assert data["workload"]["prompt_tokens"] == [4, 4, 4, 4]  # the default


def test_bundle_has_every_file_and_is_not_overwritten_without_force(bundle_dir):
    assert {p.name for p in bundle_dir.iterdir()} >= {"results.json", "README.md", "commands.txt"}
    before = (bundle_dir / "results.json").read_text()
    r = invoke("sweep", "--out", bundle_dir)
    assert r.exit_code == 2 and "--force" in r.stderr
    assert (bundle_dir / "results.json").read_text() == before


def test_force_replaces_a_bundle(copy_of):
    dst = copy_of()
    r = invoke("sweep", "--levels", "1,2", "--out", dst, "--force")
    assert r.exit_code == 0, r.output
    data = json.loads((dst / "results.json").read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_verify_passes_a_fresh_bundle_and_its_rerun(bundle_dir):
    r = invoke("verify", bundle_dir, "--rerun")
    assert r.exit_code == 0, r.output
    assert "0 failed (rerun included)" in r.stdout


TAMPERS = [
    ("levels[1].ticks", lambda d: d["levels"][1].__setitem__("ticks", 34)),
    ("levels[2].avg_batch_occupancy", lambda d: d["levels"][2].__setitem__("avg_batch_occupancy", 3.2)),
    ("levels[3].max_batch_occupancy", lambda d: d["levels"][3].__setitem__("max_batch_occupancy", 8)),
    ("levels[0].tokens_per_tick", lambda d: d["levels"][0].__setitem__("tokens_per_tick", 1.5)),
    ("levels[3].peak_kv_bytes", lambda d: d["levels"][3].__setitem__("peak_kv_bytes", 75265)),
    ("levels[1].prefill_tokens", lambda d: d["levels"][1].__setitem__("prefill_tokens", 33)),
    ("levels[1].decode_tokens", lambda d: d["levels"][1].__setitem__("decode_tokens", 55)),
    ("levels[2].sessions[3].digest", lambda d: d["levels"][2]["sessions"][3].__setitem__("digest", "0" * 64)),
    ("levels[0].tick_records[5].kv_bytes", lambda d: d["levels"][0]["tick_records"][5].__setitem__("kv_bytes", 1)),
    ("corruption_free", lambda d: d.__setitem__("corruption_free", False)),
    ("saturation_concurrency", lambda d: d.__setitem__("saturation_concurrency", 4)),
    ("levels[1].cache_misses", lambda d: d["levels"][1].__setitem__("cache_misses", 1)),
    ("first_divergence", lambda d: d["levels"][3]["sessions"][0]["tokens"].__setitem__(2, 7)),
]


@pytest.mark.parametrize("field,mutate", TAMPERS, ids=[t[0] for t in TAMPERS])
def test_a_tampered_bundle_fails_verify_naming_the_field(copy_of, field, mutate):
    dst = copy_of()
    _edit(dst, mutate)
    r = invoke("verify", dst)
    assert r.exit_code == 1, r.output
    assert f"results.json: {field}" in r.stdout or f"README.md: {field}" in r.stdout, r.stdout
    assert " expected=" in r.stdout and " found=" in r.stdout


def test_rerun_catches_tokens_rewritten_consistently(copy_of):
    from meshbench.analysis.figures import token_digest

    dst = copy_of()

    def rewrite(d):  # change a session's tokens at every level and fix up every digest
        for lv in d["levels"]:
            s = lv["sessions"][0]
            s["tokens"][-1] = (s["tokens"][-1] + 1) % 256
            s["digest"] = token_digest(s["tokens"])
            for rep in lv["repetitions"]:
                rep["sessions"][0]["digest"] = s["digest"]
            for p in lv["isolation"]["passes"]:  # and the perturbation passes that did not touch it
                if s["session_id"] not in p["perturbed"]:
                    p["sessions"][0]["digest"] = s["digest"]

    _edit(dst, rewrite)
    assert invoke("verify", dst).exit_code == 0  # internally consistent...
    r = invoke("verify", dst, "--rerun")  # ...but not what the recorded config produces
    assert r.exit_code == 1
    assert "results.json (rerun): levels[0].sessions[0]" in r.stdout


def test_an_edited_readme_table_fails(copy_of):
    dst = copy_of()
    readme = dst / "README.md"
    readme.write_text(readme.read_text().replace("| 4 | 19 | 3.111 |", "| 4 | 18 | 3.111 |"))
    r = invoke("verify", dst)
    assert r.exit_code == 1
    assert "README.md: levels[2].ticks expected=19 found=18" in r.stdout


def test_verify_reports_every_failure_not_only_the_first(copy_of):
    dst = copy_of()
    _edit(dst, lambda d: [d["levels"][i].__setitem__("ticks", 1) for i in range(4)])
    r = invoke("verify", dst)
    assert r.exit_code == 1
    assert all(f"results.json: levels[{i}].ticks" in r.stdout for i in range(4))


def test_verify_unusable_inputs_exit_2_with_one_line(tmp_path, copy_of):
    cases = {"missing": tmp_path / "nope", "empty": tmp_path / "empty"}
    cases["empty"].mkdir()
    notjson = copy_of()
    (notjson / "results.json").write_text("{not json")
    r = invoke("verify", notjson)
    assert r.exit_code == 2 and "not valid JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for path in cases.values():
        r = invoke("verify", path)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output


def test_verify_refuses_a_newer_schema_version_and_a_schema_violation(copy_of):
    dst = copy_of()
    _edit(dst, lambda d: d.__setitem__("schema_version", 99))
    r = invoke("verify", dst)
    assert r.exit_code == 2 and "schema_version 99 is newer" in r.stderr and "upgrade" in r.stderr
    _edit(
        dst,
        lambda d: (
            d.__setitem__("schema_version", results.SCHEMA_VERSION),
            d["levels"][0].__setitem__("ticks", "many"),
        ),
    )
    r = invoke("verify", dst)
    assert r.exit_code == 2 and "fails the results schema" in r.stderr and "levels.0.ticks" in r.stderr


def test_verify_refuses_an_older_schema_version_with_what_to_do(copy_of):
    dst = copy_of()
    _edit(dst, lambda d: d.__setitem__("schema_version", 1))
    r = invoke("verify", dst)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "schema_version 1 was written by an older meshbench" in r.stderr
    assert "re-run its sweep command (commands.txt beside it) with this version" in r.stderr


def test_admit_prints_each_decision_with_its_numbers():
    r = invoke(
        "admit",
        "--burst",
        "12",
        "--max-active-sessions",
        "4",
        "--max-batch-size",
        "4",
        "--max-queue-depth",
        "6",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["summary"] == {"ADMITTED": 4, "QUEUED": 6, "REJECTED_QUEUE_FULL": 2}
    last = data["decisions"][-1]
    assert (last["queue_depth"], last["max_queue_depth"], last["kv_needed_bytes"]) == (6, 6, 12 * 1536)
    r = invoke("admit", "--kv-bytes", "15000")
    assert r.exit_code == 0 and "REJECTED_KV_BUDGET" in r.stdout


def test_admit_sizes_its_engines_by_the_workloads_longest_prompt(monkeypatch):
    """A llama.cpp context is sized by the longest prompt (a burst: every active session's): admit asked for
    512 tokens a session whatever its workload."""
    from meshbench.engine import factory  # noqa: PLC0415

    seen = []
    real = factory.setup
    monkeypatch.setattr(factory, "setup", lambda spec, sizing, **kw: seen.append(sizing) or real(spec, sizing, **kw))
    config = Path(__file__).resolve().parent.parent / "configs" / "dgr-012.yaml"
    r = invoke("admit", "--config", str(config), "--burst", "3", "--prefill", "burst", "--json")
    assert r.exit_code == 0, r.output
    (sizing,) = seen  # (DGR-012's sessions: 4 prompt tokens, 8 new)
    assert (sizing.burst, sizing.max_prompt, sizing.max_total_tokens) == (True, 4, 12)


def test_committed_dgr012_config_equals_the_embedded_defaults():
    from meshbench.workload import config

    root = Path(__file__).resolve().parent.parent
    committed = config.load(root / "configs" / "dgr-012.yaml").to_dict()
    assert committed.pop("repeat") == 5  # the committed evidence records five repetitions
    embedded = config.load().to_dict()
    assert embedded.pop("repeat") == 1
    assert committed == embedded


def test_a_wrong_figure_function_is_caught_by_the_independent_recomputation(tmp_path, monkeypatch):
    """A tampered file is caught by recomputing with figures.py; a wrong figures.py, only by the second way."""
    from meshbench.analysis import figures

    real = figures.summarize_ticks

    def broken(ticks):
        out = real(ticks)
        out["avg_batch_occupancy"] += 0.5
        return out

    monkeypatch.setattr(figures, "summarize_ticks", broken)  # used by the sweep AND by verify
    out = tmp_path / "b"
    r = invoke("sweep", "--out", out)
    assert r.exit_code == 1, r.output
    assert "levels[0].avg_batch_occupancy (independent recomputation) expected=1.0 found=1.5" in r.stderr
    r = invoke("verify", out)
    assert r.exit_code == 1
    failures = [line for line in r.stdout.splitlines() if "expected=" in line]
    assert len(failures) == 4 and all("avg_batch_occupancy (independent recomputation)" in f for f in failures)
