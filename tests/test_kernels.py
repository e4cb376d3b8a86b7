"""verify --rerun where llama.cpp's kernels differ from the recording ones (another CPU feature set, another
llama.cpp): the tokens and what follows from their values are bound to the recording kernels and reported,
not failed; the schedule, admission and KV bytes must still reproduce, and the rerun's own records are
checked in full. On the recording kernels a changed token still fails."""

from __future__ import annotations

import copy
import dataclasses
import json
import shlex
import shutil
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")

import factories as f  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from meshbench.analysis import figures  # noqa: E402
from meshbench.analysis.checks import Checks  # noqa: E402
from meshbench.cli import app  # noqa: E402
from meshbench.records import serial  # noqa: E402
from meshbench.records.context import Compute, LlamaCppBuild  # noqa: E402
from meshbench.results import fingerprint, kinds  # noqa: E402
from meshbench.verify import bundle as verify  # noqa: E402
from meshbench.verify import kernels, reproduce  # noqa: E402

runner = CliRunner()
AVX2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 |"
AVX512 = AVX2 + " AVX512 = 1 |"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A GGUF bundle (the tiny Q8_0 model, levels 1 and 2) and its model, made once."""
    d = tmp_path_factory.mktemp("kernels")
    model = f.tiny_gguf(d / "tiny-q8_0.gguf", "q8_0")
    out = d / "B"
    args = ["sweep", "--engine", "gguf", "--model", str(model), "--levels", "1,2", "--repeat", "2", "--warmup", "1"]
    r = runner.invoke(app, [*args, "--out", str(out)])  # (CliRunner records the command as plain "meshbench")
    assert r.exit_code == 0, r.output
    return out


def _on(data: dict, system_info: str) -> dict:
    """The same records, as if llama.cpp had reported these CPU features (on a CPU with the flags they need)."""
    compute = dict(data["environment"]["compute"])
    compute["llama_cpp"] = dict(compute["llama_cpp"], system_info=system_info)
    if "AVX512 = 1" in system_info and compute["simd"]:
        compute["simd"] = sorted({*compute["simd"], "avx512f"})
    data["environment"]["compute"] = f.compute_digest(compute)
    return data


def _other_than_here() -> tuple[str, str]:
    """Kernels other than this machine's, and how verify says where AVX-512 is: AVX2 where this machine's llama.cpp
    runs AVX-512 (it is then only here), else AVX-512 (only recorded)."""
    here = fingerprint.llama_kernels(fingerprint.fingerprint()) or ""
    return (AVX2, "only here: AVX512") if "AVX512" in here.split() else (AVX512, "only recorded: AVX512")


def _flip_token(data: dict, level: int = 1, session: int = 0, token: int = 3) -> str:
    """Another token at one place, its digest and decode feed as a run would have written them."""
    s = data["levels"][level]["sessions"][session]
    s["tokens"][token] = (s["tokens"][token] + 1) % 256
    s["digest"] = "0" * 64
    for t in data["levels"][level]["tick_records"]:
        for feed in t["decode_feed"]:
            if feed[0] == s["session_id"] and feed[1] == s["prompt_tokens"] + token:
                feed[2] = s["tokens"][token]
    return s["session_id"]


def _rerun_as(fresh: dict):
    return lambda _data: copy.deepcopy(fresh)


def test_the_kernel_family_is_llama_cpps_version_and_the_features_it_reports():
    fp = fingerprint.fingerprint()
    built = dataclasses.replace(fp, llama_cpp=LlamaCppBuild(version="0.3.36", system_info=AVX2))
    assert fingerprint.llama_kernels(built) == "0.3.36: AVX AVX2 BMI2 F16C FMA LLAMAFILE OPENMP SSE3 SSSE3"
    assert fingerprint.llama_kernels(dataclasses.replace(fp, llama_cpp=None)) is None
    assert fingerprint.llama_kernels(None) is None
    off = LlamaCppBuild(version="0.3.36", system_info="CPU : AVX2 = 0 |")
    assert fingerprint.llama_kernels(dataclasses.replace(fp, llama_cpp=off)) == "0.3.36: no CPU features reported"


def test_a_token_that_differs_on_other_kernels_is_reported_bound_to_them_not_failed(made):
    recorded = _on(json.loads((made / "results.json").read_text()), AVX512)
    fresh = _on(copy.deepcopy(recorded), AVX2)
    _flip_token(fresh)
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert c.failures == [], [str(x) for x in c.failures]
    k = outcome.kernels
    assert k is not None and "AVX512" in k.recorded and "AVX512" not in k.here
    assert "levels[1].sessions[0].tokens" in k.bound and "levels[1].sessions[0].digest" in k.bound
    assert any(x.endswith(".decode_feed") for x in k.bound) and c.kernel_bound == len(k.bound)
    text = str(outcome)
    assert f"NOT reproduced here: {len(k.bound)} of {k.compared} records bound to llama.cpp's kernels" in text, text
    assert "only recorded: AVX512" in text and "the tokens of 1 session record among them, first levels[1]" in text
    assert "held here: the schedule, admission" in text, text


def test_the_schedule_still_fails_on_other_kernels(made):
    recorded = _on(json.loads((made / "results.json").read_text()), AVX2)  # (recorded on AVX2, rerun here)
    fresh = copy.deepcopy(json.loads((made / "results.json").read_text()))
    _flip_token(fresh)
    fresh["levels"][1]["tick_records"][2]["kv_bytes"] += 1
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert [x.field for x in c.failures] == ["levels[1].tick_records[2].kv_bytes"], [str(x) for x in c.failures]
    assert outcome.failed == 1 and str(outcome).startswith("does not reproduce here")


def test_a_token_that_differs_on_the_recording_kernels_fails(made):
    recorded = json.loads((made / "results.json").read_text())
    fresh = copy.deepcopy(recorded)
    _flip_token(fresh)
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert outcome.kernels is None and c.kernel_bound == 0
    assert any(x.field.startswith("levels[1].sessions[0] ") for x in c.failures), [str(x) for x in c.failures]


def test_where_tokens_differ_and_drive_the_schedule_only_the_engine_inputs_and_failures_are_held(made):
    recorded = json.loads((made / "results.json").read_text())
    recorded["config"]["workload"]["eos"] = "stop"  # a session ends at its end-of-generation token
    fresh = _on(copy.deepcopy(recorded), AVX2)
    fresh["levels"][1]["sessions"][0]["end_tick"] += 1
    fresh["levels"][1]["tick_records"][2]["kv_bytes"] += 1
    c = Checks()
    reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert [x.field for x in c.failures] == ["levels[1].sessions[0]", "levels[1].tick_records[2].kv_bytes"], (
        "with every token the same the schedule is held"
    )
    _flip_token(fresh)
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert c.failures == [] and outcome.kernels is not None and outcome.kernels.schedule_bound
    text = str(outcome)
    assert "held here: the engine, the inputs and that isolation holds" in text, text
    assert "with them 2 schedule records (levels[1].sessions[0], levels[1].tick_records[2].kv_bytes)" in text, text
    fresh["levels"][1]["sessions"][1]["done_reason"] = "FAILED"  # a failed session is held on any kernels
    c = Checks()
    reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert [x.field for x in c.failures] == [kernels.CORRUPTION_HELD]
    # the recipe, too, is held there: a recipe fingerprint that is not what the same recipe computes fails
    fresh["levels"][1]["sessions"][1]["done_reason"] = recorded["levels"][1]["sessions"][1]["done_reason"]
    fresh["engine"]["recipe_fingerprint"] = "0" * 64
    c = Checks()
    reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert [x.field for x in c.failures] == [kernels.RECIPE]


def test_corruption_free_where_batch_invariance_decides_it_is_bound_to_the_kernels(made):
    """Where isolation did not run, corruption_free needs batch invariance, which other kernels may not give
    (an AVX2 EPYC reran MB-BENCH-GGUF-CHUNKED batch-variant): that part is reported, what remains held."""
    recorded = json.loads((made / "results.json").read_text())
    fresh = _on(copy.deepcopy(recorded), AVX2)
    _flip_token(fresh)
    fresh["batch_invariant"] = fresh["corruption_free"] = False
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh))
    assert c.failures == [] and {"batch_invariant", "corruption_free"} <= set(outcome.kernels.bound)
    assert "the batch-invariance verdict is the recording kernels' and differs here" in str(outcome)


@pytest.mark.parametrize(
    "forge, named",
    [
        (lambda b: b.update(system_info=AVX2 + " AMX_INT8 = 1 |"), "reports AMX_INT8 on a CPU without amx_int8"),
        (lambda b: b.update(version="0.3.36\u200b"), "is not a version"),
        (lambda b: b.update(system_info=AVX2.replace("SSE3", "SSE3\u200b")), "characters no build prints"),
    ],
)
def test_a_fingerprint_whose_llama_cpp_its_cpu_contradicts_fails_plain_verify(made, tmp_path, forge, named):
    data = json.loads((made / "results.json").read_text())
    if "amx_int8" in data["environment"]["compute"]["simd"]:
        pytest.skip("this CPU runs AMX")
    compute = data["environment"]["compute"]
    forge(compute["llama_cpp"])
    _on(data, compute["llama_cpp"]["system_info"])
    assert any(
        named in x for x in fingerprint.contradictions(serial.from_json(data["environment"]["compute"], Compute))
    )
    c = verify.check_data(data)
    assert [x.field for x in c.failures] == ["environment.compute (its llama.cpp against its CPU)"]


def test_a_gguf_bundle_without_llama_cpp_in_its_fingerprint_fails_plain_verify(made):
    data = json.loads((made / "results.json").read_text())
    compute = {k: v for k, v in data["environment"]["compute"].items() if k != "digest"}
    compute["llama_cpp"] = None
    data["environment"]["compute"] = f.compute_digest(compute)
    c = verify.check_data(data)
    assert [x.field for x in c.failures] == ["environment.compute.llama_cpp (the GGUF engine runs llama.cpp)"]


def test_the_reruns_own_records_are_checked_where_the_kernels_differ(made):
    recorded = json.loads((made / "results.json").read_text())
    fresh = _on(copy.deepcopy(recorded), AVX2)
    _flip_token(fresh)  # its digest no longer the tokens' (a rerun that contradicts itself)
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, _rerun_as(fresh), check_own=verify.check_fresh)
    assert outcome.kernels.own is not None and outcome.kernels.own[1] > 0
    assert c.failures and all(x.file.endswith("its own records") for x in c.failures)
    assert "the rerun's own records" in str(outcome)


def test_verify_rerun_of_a_bundle_recorded_on_other_kernels_passes_and_says_so(made, tmp_path):
    """The bundle says it was made on other kernels than this machine's (its README rendered to match): a real
    rerun here."""
    b = tmp_path / "B"
    shutil.copytree(made, b)
    other, said = _other_than_here()
    data = _on(json.loads((made / "results.json").read_text()), other)
    (b / "results.json").write_text(json.dumps(data, indent=1))
    (b / "README.md").write_text(kinds.readme(data, verify.bundle_name((made / "README.md").read_text(), made)))
    r = runner.invoke(app, ["verify", str(b), "--rerun"])
    assert r.exit_code == 0, r.output
    assert "the rerun's own records" in r.output and said in r.output, r.output
    assert "records bound to llama.cpp's kernels, which differ" in r.output and "reproduced nonetheless" in r.output


def test_the_reruns_own_records_are_held_to_what_a_rerun_runs_not_to_the_recorded_command(made):
    """A rerun runs one repetition with no warm-up under the recorded command: its own check must not hold it
    to that command's --repeat and --warmup (CI failed two bundles made with --repeat 5 --warmup 1 so)."""
    from meshbench.sweep import run

    recorded = _on(json.loads((made / "results.json").read_text()), AVX2)
    model = recorded["config"]["engine"]["model"]
    words = ["meshbench", "sweep", "--engine", "gguf", "--model", model, "--levels", "1,2"]
    recorded["command"] = shlex.join([*words, "--repeat", "2", "--warmup", "1"])
    assert verify.check_data(recorded).failures == []  # (the command agrees with the echo as recorded)
    c = Checks()
    outcome = reproduce.check_rerun(c, recorded, run.rerun_results, check_own=verify.check_fresh)
    assert c.failures == [], [str(x) for x in c.failures]
    assert outcome.kernels is not None and outcome.kernels.own is not None and outcome.kernels.own[1] == 0


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """A one-level GGUF bundle without isolation passes or repetitions: a changed token then has one digest
    and one repetition record to make consistent, as a forger of a real bundle makes all of them."""
    d = tmp_path_factory.mktemp("kernels-single")
    model = f.tiny_gguf(d / "tiny-q8_0.gguf", "q8_0")
    out = d / "B"
    args = ["sweep", "--engine", "gguf", "--model", str(model), "--levels", "2", "--repeat", "1", "--warmup", "0"]
    r = runner.invoke(app, [*args, "--no-isolation", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _forged(made, tmp_path, forge) -> Path:
    """The bundle with one session's last token changed (its digests and README made to match) and its
    fingerprint forged by ``forge(llama_cpp)``, the digest recomputed: what a forger would commit."""
    b = tmp_path / "B"
    shutil.copytree(made, b)
    data = json.loads((made / "results.json").read_text())
    level = data["levels"][0]
    s = level["sessions"][0]
    s["tokens"][-1] = (s["tokens"][-1] + 1) % 256  # (the last token is fed to no decode)
    s["digest"] = figures.token_digest(s["tokens"])
    for rep in level["repetitions"]:
        for x in rep["sessions"]:
            if x["session_id"] == s["session_id"]:
                x["digest"] = s["digest"]
    compute = data["environment"]["compute"]
    forge(compute["llama_cpp"])
    _on(data, compute["llama_cpp"]["system_info"])
    (b / "results.json").write_text(json.dumps(data, indent=1))
    (b / "README.md").write_text(kinds.readme(data, verify.bundle_name((made / "README.md").read_text(), made)))
    return b


def _drop_a_feature(llama_cpp: dict) -> None:
    info = llama_cpp["system_info"]
    on = [w.split(" = ")[0].strip() for w in info.split("|") if w.strip().endswith("= 1")]
    llama_cpp["system_info"] = info.replace(f"{on[-1]} = 1", f"{on[-1]} = 0")


@pytest.mark.parametrize(
    "forge",
    [lambda lc: lc.update(version="0.3.35"), _drop_a_feature],  # another llama.cpp; one CPU feature fewer
    ids=["version", "one-feature"],
)
def test_a_forged_fingerprint_does_not_turn_a_changed_token_into_exit_0(single, tmp_path, forge):
    """Finding 1 of probe 5: a changed token behind a forged kernel fingerprint exited 0 ("NOT reproduced here"
    as a note). A rerun that did not reproduce the tokens has not confirmed them: exit 4 unless the gate opts in."""
    b = _forged(single, tmp_path, forge)
    assert verify.check_data(json.loads((b / "results.json").read_text())).failures == []  # (a consistent forgery)
    r = runner.invoke(app, ["verify", str(b), "--rerun"])
    assert r.exit_code == 4, r.output
    assert ": NOT REPRODUCED: " in r.output and "NOT reproduced here, so not confirmed (exit 4)" in r.output
    r = runner.invoke(app, ["verify", str(b), "--rerun", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 4 and doc["exit_code"] == 4 and doc["bundles"][0]["status"] == "NOT REPRODUCED"
    assert doc["bundles"][0]["kernel_bound"] > 0 and doc["bundles"][0]["failed"] == 0
    r = runner.invoke(app, ["verify", str(b), "--rerun", "--accept-other-kernels"])
    assert r.exit_code == 0, r.output
    assert "(accepted: --accept-other-kernels)" in r.output


def test_accept_other_kernels_without_a_rerun_is_refused(made):
    r = runner.invoke(app, ["verify", str(made), "--accept-other-kernels"])
    assert r.exit_code == 2 and "give --rerun as well" in r.output


def test_several_bundles_exit_with_a_failure_before_what_other_kernels_left_unconfirmed(single, tmp_path):
    """A review of probe 5: exit 4 outranked exit 1 (max of the codes), so a gate tolerating 4 passed a failure."""
    forged = _forged(single, tmp_path / "f", lambda lc: lc.update(version="0.3.35"))
    failing = tmp_path / "bad"
    shutil.copytree(single, failing)
    (failing / "README.md").write_text((failing / "README.md").read_text() + "\nedited\n")
    r = runner.invoke(app, ["verify", str(forged), str(failing), "--rerun"])
    assert r.exit_code == 1, r.output
    assert f"{failing}: FAIL:" in r.output and "(exit 4)" not in r.output.split(f"{failing}: FAIL:")[1].split("\n")[0]
    r = runner.invoke(app, ["verify", str(forged), str(tmp_path / "absent"), "--rerun"])
    assert r.exit_code == 2, r.output


def test_a_kernel_family_s_vector_width_is_its_widest_simd():
    """CI verifies a bundle from its records, not rerun, only where this CPU's kernels are narrower than its."""
    assert fingerprint.vector_bits("0.3.36: AVX AVX2 AVX512 AVX512_VNNI BMI2 F16C FMA") == 512
    assert fingerprint.vector_bits("0.3.36: AVX AVX2 AVX_VNNI BMI2 F16C FMA") == 256  # (AVX_VNNI is not AVX-512)
    assert fingerprint.vector_bits("0.3.36: AVX F16C") == 128
    assert fingerprint.vector_bits("0.3.36: no CPU features reported") == fingerprint.vector_bits(None) == 0
