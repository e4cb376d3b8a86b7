"""llama.cpp's machine-dependent recipe (weight repacking, flash attention): auto resolved on this machine, the
probe's answer cached by the CPU's fingerprint, what was used recorded, and a rerun held to it."""

import dataclasses
import json

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable: the GGUF engine is untested")

import factories as f  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from meshbench import machine  # noqa: E402
from meshbench.cli import app  # noqa: E402
from meshbench.engine import recipe  # noqa: E402
from meshbench.engine.spec import EngineSpec  # noqa: E402
from meshbench.errors import MeshbenchError  # noqa: E402
from meshbench.results import fingerprint  # noqa: E402
from meshbench.sweep import run  # noqa: E402

runner = CliRunner()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of its own and no answer remembered in memory."""
    monkeypatch.setenv("MESHBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(recipe, "_repack_failure", {})
    return tmp_path / "cache" / "probes"


@pytest.fixture
def model(tmp_path):
    return f.tiny_gguf(tmp_path / "m.gguf")


def no_amx():
    if any(flag.startswith("amx") for flag in machine.simd_flags()):
        pytest.skip("this CPU reports AMX: its repacked kernels may really die here")


def test_the_repack_probe_runs_where_the_cpu_has_no_amx(cache, model):
    """The probe once freed its token buffer before llama_decode ('invalid token[1]') and so refused repacking on
    every machine; on a CPU without AMX (whose repacked kernels are the ones that die), it must run."""
    no_amx()
    assert recipe._probe(str(model)) == (None, True)
    assert recipe.repack(True, model) == (True, None)
    used, why = recipe.repack("auto", model)
    assert used is True and why.startswith("on: ")
    assert recipe.repack(False, model) == (False, None)


def test_the_probe_runs_once_per_model_and_machine(cache, model, monkeypatch):
    calls = []
    monkeypatch.setattr(recipe, "_probe", lambda path: (calls.append(path) or "died with SIGILL", True))
    assert recipe.repack("auto", model) == (False, "off: llama.cpp's repacked kernels died with SIGILL on this CPU "
                                                   "in a probe of this model")  # fmt: skip
    monkeypatch.setattr(recipe, "_repack_failure", {})  # a new process: the answer comes from the cache file
    assert recipe.repack_failure(model) == recipe.Probe("died with SIGILL", final=True) and len(calls) == 1
    (file,) = cache.iterdir()
    file.write_text("{not json")  # a damaged cache file is probed again, never an error
    monkeypatch.setattr(recipe, "_repack_failure", {})
    assert recipe.repack_failure(model).kernels_die and len(calls) == 2
    assert json.loads(file.read_text())["why"] == "died with SIGILL"
    # another CPU (its kernel-selecting flags) is another key: probed again
    monkeypatch.setattr(recipe, "_repack_failure", {})
    monkeypatch.setattr(machine, "simd_flags", lambda: ["avx2"])
    recipe.repack_failure(model)
    assert len(calls) == 3 and len(list(cache.iterdir())) == 2
    # the same CPU under another OS kernel, or behind a hypervisor (either may withhold AMX's tile state): probed
    monkeypatch.setattr(machine, "os_kernel", lambda: "Linux 6.1")
    monkeypatch.setattr(machine, "under_hypervisor", lambda: True)
    for part, value in (("os_kernel", lambda: "Linux 5.15"), ("under_hypervisor", lambda: False)):
        monkeypatch.setattr(recipe, "_repack_failure", {})
        recipe.repack_failure(model)
        monkeypatch.setattr(machine, part, value)
        monkeypatch.setattr(recipe, "_repack_failure", {})
        recipe.repack_failure(model)
    assert len(calls) == 6 and len(list(cache.iterdir())) == 5


def test_the_os_kernel_is_its_major_and_minor_release():
    assert machine.os_kernel("6.1.0-18-amd64").endswith(" 6.1")
    assert machine.os_kernel("5.15.153.1-microsoft-standard-WSL2").endswith(" 5.15")
    assert machine.os_kernel("6.8").endswith(" 6.8")


def test_the_hypervisor_flag_is_read_from_cpuinfo():
    assert machine.under_hypervisor("processor : 0\nflags\t\t: fpu avx2 hypervisor\n") is True
    assert machine.under_hypervisor("processor : 0\nflags\t\t: fpu avx2\n") is False
    assert machine.under_hypervisor("processor : 0\n") is None


def test_a_probe_that_says_nothing_of_the_kernels_is_not_cached_and_a_poisoned_cache_is_probed_again(
    cache, model, monkeypatch
):
    calls = []
    monkeypatch.setattr(recipe, "_probe", lambda path: (calls.append(path) or "did not finish within 300 s", False))
    assert recipe.repack("auto", model)[0] is False
    assert recipe.repack_failure(model) == recipe.Probe("did not finish within 300 s", final=False)
    assert not recipe.repack_failure(model).kernels_die and len(calls) == 1  # (held for the process)
    assert not cache.exists() or not list(cache.iterdir())  # a timeout is not an answer: asked again next time
    cache.mkdir(parents=True, exist_ok=True)
    key = recipe.probe_key(model)
    for poison in ("[" * 200_000, json.dumps({"format": 1, "key": key, "why": "x" * 500}), '{"format": 1}'):
        (cache / f"repack-{key}.json").write_text(poison)
        monkeypatch.setattr(recipe, "_repack_failure", {})
        recipe.repack_failure(model)
    assert len(calls) == 4


@pytest.mark.parametrize(
    "code, why, final",
    [
        (0, None, True),
        (recipe.DECODE_FAILED, "failed to decode (llama_decode)", True),
        (-4, "died with SIGILL", True),
        (-11, "died with SIGSEGV", True),
        (-9, "was stopped by SIGKILL", False),  # (out of memory, say: nothing of the kernels, asked again)
        (-15, "was stopped by SIGTERM", False),
        (1, "exited 1", False),
    ],
)
def test_only_the_kernels_own_crash_is_an_answer_to_cache(monkeypatch, code, why, final):
    monkeypatch.setattr(recipe.subprocess, "run", lambda *a, **k: type("Done", (), {"returncode": code})())
    assert recipe._probe("m.gguf") == (why, final)
    assert recipe.Probe(why, final).kernels_die is (why is not None and final)


def test_repack_true_where_its_kernels_die_is_refused_in_one_line(cache, model, monkeypatch):
    monkeypatch.setattr(recipe, "_probe", lambda path: ("died with SIGILL", True))
    with pytest.raises(recipe.RepackRefused, match="engine.repack true: .*died with SIGILL") as e:
        recipe.repack(True, model)
    assert "\n" not in str(e.value)
    r = runner.invoke(app, ["sweep", "--engine", "gguf", "--model", str(model), "--repack", "on", "--levels", "1"])
    assert r.exit_code != 0 and "died with SIGILL" in r.output and "Traceback" not in r.output


def test_flash_attention_auto_is_read_from_llama_cpps_log():
    assert recipe.flash_attn_chosen(
        ["llama_context: flash_attn = auto\n", "resolve_fused_ops: Flash Attention enabled\n"]
    )
    assert not recipe.flash_attn_chosen(["resolve_fused_ops: Flash Attention disabled\n"])
    # (what llama.cpp says where a layer's device cannot run it)
    assert not recipe.flash_attn_chosen(["resolve_fused_ops: Flash Attention not supported, set to disabled\n"])
    with pytest.raises(MeshbenchError, match="did not say whether it enabled flash attention"):
        recipe.flash_attn_chosen(["llama_context: flash_attn = auto\n"])


def test_a_recipe_flag_takes_auto_on_or_off():
    r = runner.invoke(app, ["sweep", "--engine", "gguf", "--model", "x.gguf", "--repack", "maybe"])
    assert r.exit_code != 0 and "--repack: 'maybe' is none of auto, on, off" in r.output
    assert "Traceback" not in r.output


def test_a_synthetic_config_may_say_repack_false():
    """A synthetic bundle's config echo has repack: false from when it was the default: still a valid config."""
    assert EngineSpec(kind="synthetic", repack=False).repack is False
    with pytest.raises(MeshbenchError, match="engine.repack needs the gguf engine"):
        EngineSpec(kind="synthetic", repack=True)


def sweep(out, model, *flags):
    r = runner.invoke(
        app, ["sweep", "--engine", "gguf", "--model", str(model), "--levels", "1,2", "--out", str(out), *flags]
    )
    assert r.exit_code == 0, r.output
    return json.loads((out / "results.json").read_text())


def test_the_bundle_records_what_auto_resolved_to_and_a_rerun_is_held_to_it(cache, model, tmp_path, monkeypatch):
    no_amx()
    auto = sweep(tmp_path / "auto", model)
    e = auto["engine"]
    assert auto["config"]["engine"]["repack"] == "auto" and auto["config"]["engine"]["flash_attn"] == "auto"
    assert e["repack"] is True and e["recipe_auto"]["repack"].startswith("on: ")
    assert (
        e["flash_attn"] is True
        and e["recipe_auto"]["flash_attn"] == "on: llama.cpp's own choice for this model and device"
    )
    fixed = sweep(tmp_path / "fixed", model, "--repack", "off", "--flash-attn", "off")
    assert fixed["engine"]["repack"] is False and fixed["engine"]["flash_attn"] is False
    assert "recipe_auto" not in fixed["engine"]
    assert fixed["engine"]["recipe_fingerprint"] != e["recipe_fingerprint"]

    r = runner.invoke(app, ["verify", str(tmp_path / "auto"), "--rerun"])
    assert r.exit_code == 0, r.output
    # on this same machine (the bundle's compute fingerprint), a rerun without its repacking is refused in one line
    monkeypatch.setattr(recipe, "repack_failure", lambda path: recipe.Probe("died with SIGILL", final=True))
    r = runner.invoke(app, ["verify", str(tmp_path / "auto"), "--rerun"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    said = " ".join(r.output.split())
    assert "weight repacking on this same CPU and llama.cpp build (its compute fingerprint)" in said
    # on another machine where the repacked kernels die, it runs without them and is judged as on other kernels
    other = dataclasses.replace(fingerprint.fingerprint(), cpu="Another CPU")
    other = dataclasses.replace(other, digest=fingerprint.digest(other))
    monkeypatch.setattr(fingerprint, "fingerprint", lambda: other)
    r = runner.invoke(app, ["verify", str(tmp_path / "auto"), "--rerun"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert (
        "which the recipe picks otherwise here ([repack on, flash attention on] recorded, [repack off, flash "
        "attention on] here, as llama.cpp's repacked kernels died with SIGILL on this CPU" in said
    )
    # a probe that timed out says nothing of the kernels: refused rather than checking tokens no more
    monkeypatch.setattr(recipe, "repack_failure", lambda path: recipe.Probe("did not finish within 120 s", final=False))
    swept, sweep_on_node = [], run.sweep_on_node  # (refused before the sweep: the model is at hand)
    monkeypatch.setattr(run, "sweep_on_node", lambda *a, **k: swept.append(a))
    r = runner.invoke(app, ["verify", str(tmp_path / "auto"), "--rerun"])
    monkeypatch.setattr(run, "sweep_on_node", sweep_on_node)
    assert not swept
    assert r.exit_code != 0 and "and here its repacked kernels did not finish within 120 s in a probe" in " ".join(
        r.output.split()
    )
    # flash attention reruns as it ran, whatever llama.cpp's auto would choose here
    monkeypatch.setattr(recipe, "repack_failure", lambda path: recipe.Probe(None, final=True))
    monkeypatch.setattr(recipe, "flash_attn_chosen", lambda log: False)
    r = runner.invoke(app, ["verify", str(tmp_path / "auto"), "--rerun"])
    assert r.exit_code == 0 and "llama.cpp's kernels" not in r.output, r.output
    # a bundle made with both off reruns with both off, whatever this machine's auto would choose: reproduced whole
    r = runner.invoke(app, ["verify", str(tmp_path / "fixed"), "--rerun"])
    assert r.exit_code == 0 and "llama.cpp's kernels" not in r.output, r.output


def test_plain_verify_holds_the_recorded_recipe_to_the_echo(cache, model, tmp_path):
    no_amx()
    sweep(tmp_path / "b", model)
    path = tmp_path / "b" / "results.json"
    good = json.loads(path.read_text())
    forged = {
        "repack False where recipe_auto.repack says": lambda d: d["engine"].update(repack=False),
        "recipe_auto.flash_attn for a setting the echo does not leave auto": lambda d: d["config"]["engine"].update(
            flash_attn=True
        ),
        "repack True where recipe_auto.repack says 'off: forged'": lambda d: d["engine"]["recipe_auto"].update(
            repack="off: forged"
        ),
        "engine.kind (= config.engine.kind) expected=synthetic found=gguf": lambda d: d["config"]["engine"].update(
            kind="synthetic"
        ),
    }
    for said, forge in forged.items():
        d = json.loads(json.dumps(good))
        forge(d)
        path.write_text(json.dumps(d, indent=1))
        r = runner.invoke(app, ["verify", str(tmp_path / "b")])
        assert r.exit_code == 1 and "Traceback" not in r.output, said
        assert said in r.output, (said, r.output)


def test_a_rerun_whose_model_make_model_writes_is_judged_after_its_sweep(cache, tmp_path, monkeypatch):
    """A bundle's make_model goes to meshbench's cache, absent before the rerun's sweep: the probe is asked after
    it, and must say what the rerun ran by (an engine in its own process probes for itself)."""
    no_amx()
    cfg = tmp_path / "made.yaml"
    cfg.write_text(
        f"engine: {{kind: gguf, model: {tmp_path / 'made.gguf'}, make_model: {{preset: dgr-012, type: q8_0}}}}\n"
        "levels: [1, 2]\n"
    )
    r = runner.invoke(app, ["sweep", "--config", str(cfg), "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "results.json").read_text())["engine"]["repack"] is True
    other = dataclasses.replace(fingerprint.fingerprint(), cpu="Another CPU")
    other = dataclasses.replace(other, digest=fingerprint.digest(other))
    monkeypatch.setattr(fingerprint, "fingerprint", lambda: other)

    def rerun(answers):
        for made in (cache.parent / "models").glob("*.gguf"):
            made.unlink()  # (absent before the sweep: nothing to probe then)
        asked = iter(answers)
        monkeypatch.setattr(recipe, "repack_failure", lambda path: next(asked))
        return runner.invoke(app, ["verify", str(tmp_path / "b"), "--rerun"])

    died = recipe.Probe("died with SIGILL", final=True)
    r = rerun([died] * 3)  # the sweep's probe, then the check's (repack, then the verdict)
    assert r.exit_code == 0 and "llama.cpp's repacked kernels died with SIGILL" in " ".join(r.output.split()), r.output
    r = rerun([recipe.Probe("did not finish within 300 s", final=False), died, died])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "the rerun ran without it (off: llama.cpp's repacked kernels did not finish within 300 s" in said
    assert "a probe here now says off: llama.cpp's repacked kernels died with SIGILL" in said
    r = rerun([died, recipe.Probe(None, final=True), recipe.Probe(None, final=True)])
    assert r.exit_code != 0 and "a probe here now says on: " in " ".join(r.output.split()), r.output
