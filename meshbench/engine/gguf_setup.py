"""The GGUF engine's setup: the model loaded once, the KV and context sizes llama.cpp allocated, the recipe
and the RPC topology recorded, and a factory of engines over the one loaded model."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from meshbench import files, limits
from meshbench.engine import recipe, rpc
from meshbench.engine.base import (
    PROBE_LIMITS,
    EngineLimits,
    check_context,
)
from meshbench.engine.gguf_engine import GgufEngine
from meshbench.engine.llama_model import (
    KV_TYPES,
    LoadedModel,
    capture_log,
    kv_cache_log,
    topology,
)
from meshbench.engine.setup import EngineRecord, EngineSetup, describe
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError


def setup_gguf(
    spec: EngineSpec,
    max_total_tokens: int,
    max_sessions: int,
    max_prompt: int = 512,
    verbose: bool = False,
    endpoints: Sequence[rpc.Endpoint] = (),
    burst: bool = False,
) -> EngineSetup:
    """Load the model once (on the RPC workers' devices when ``endpoints`` are given). ``burst``: a tick may
    prefill every session's prompt at once (a mixed batch is sized for it)."""
    model = _load(spec, max_total_tokens, max_sessions, verbose, endpoints)
    settings = spec  # (flash_attn auto: llama.cpp's choice in the probe context, then that for every engine)

    def make(limits: EngineLimits) -> GgufEngine:
        # A tick prefills at most max(the longest prompt, the prefill budget) tokens (the first always runs), or in
        # a burst every active session's prompt.
        budget = max_prompt * limits.max_active_sessions if burst else limits.max_prefill_tokens_per_tick
        prefill = max(max_prompt, budget) if spec.mixed_batch else max_prompt
        # (llama.cpp computes a burst in pieces of its n_ubatch: its compute buffer does not grow with the burst)
        return GgufEngine(
            model,
            limits.max_active_sessions,
            max_total_tokens,
            settings,
            prefill,
            limits.prefix_block_tokens,
            limits.kv_bytes,
        )

    with capture_log() as context_log:
        probe = make(PROBE_LIMITS)
    auto = {"repack": model.repack_why} if model.repack_why else {}
    if spec.flash_attn == recipe.AUTO:
        probe.flash_attn = chosen = recipe.flash_attn_chosen(context_log)
        settings = dataclasses.replace(spec, flash_attn=chosen)  # (every engine make() makes from here on)
        auto["flash_attn"] = f"{'on' if chosen else 'off'}: llama.cpp's own choice for this model and device"
    kv_log = kv_cache_log(context_log)
    if model.n_swa:  # which layers slide is llama.cpp's architecture code: its SWA cache names them
        model.geometry = model.geometry.with_windows(model.n_swa, kv_log["swa_layers"])
    info = _record(probe, spec, model, kv_log, context_log, auto)
    probe.close()
    return EngineSetup(make, info, model.vocab_size, model.n_ctx_train, resource=model, eog=frozenset(model.eog))


def _record(
    probe: GgufEngine, spec: EngineSpec, model: LoadedModel, kv_log: dict, context_log: list[str], auto: dict
) -> EngineRecord:
    """The engine record of results.json: the model, the recipe (each auto choice resolved, and what decided it),
    the KV geometry and llama.cpp's allocation."""
    return describe(
        probe,
        "gguf",
        preset=None,
        model=spec.model,
        model_sha256=model.sha256,
        architecture=model.arch,
        device=model.device,
        dtype=f"weights per file; KV {spec.kv_type}",
        threads=probe.threads,
        flash_attn=probe.flash_attn,
        kv_unified=spec.kv_unified,
        mixed_batch=spec.mixed_batch,
        repack=model.repack,
        tiled_mm=spec.tiled_mm,
        model_name=model.name,
        eog_tokens=list(model.eog),
        vocab_size=model.vocab_size,
        kv_geometry=model.geometry.to_dict(KV_TYPES[spec.kv_type][1]),
        kv_allocated=_allocation(probe, kv_log),
        rpc=_rpc_record(model, spec, context_log) if model.endpoints else None,
        **({"recipe_auto": auto} if auto else {}),
    )


def _load(
    spec: EngineSpec, max_total_tokens: int, max_sessions: int, verbose: bool, endpoints: Sequence[rpc.Endpoint]
) -> LoadedModel:
    """The model, loaded once, after every check that can refuse it without loading it."""
    if not spec.model:
        raise MeshbenchError("engine gguf needs --model PATH (a .gguf file; make one with meshbench model make-tiny)")
    path = files.regular_file(spec.model, "model")
    check_tiled_mm_environment(spec.tiled_mm)
    repack, why = recipe.repack(spec.repack, path)
    model = LoadedModel(path, spec.device, verbose, endpoints, spec.split, repack)
    model.repack_why = why
    check_context(max_total_tokens, model.n_ctx_train)  # before any context is sized by it
    if max_sessions > limits.MAX_LLAMA_SEQUENCES:
        raise MeshbenchError(
            f"concurrency {max_sessions}: a llama.cpp context holds at most {limits.MAX_LLAMA_SEQUENCES} sequences"
        )
    return model


def _allocation(probe: GgufEngine, kv_log: dict) -> dict:
    """llama.cpp's own word on the probe context's KV cache: cells and bytes per cell, summed over its caches
    (its log prints MiB to two decimals, so the bytes per cell are good to about 0.1% here)."""
    caches = kv_log["caches"]
    cells = caches[0]["cells"] if caches else 0
    mib = sum(c["k_mib"] + c["v_mib"] for c in caches)
    return {"caches": caches, "cells": cells, "bytes_per_cell": round(mib * (1 << 20) / cells, 1) if cells else None}


def check_tiled_mm_environment(tiled_mm: str) -> None:
    """ggml reads GGML_CPU_TILED_MM once per process: the setting the recipe names must be the one in force."""
    expected = {"auto": (None, None), "off": ("0", None), "force": (None, "1")}[tiled_mm]
    found = (os.environ.get("GGML_CPU_TILED_MM"), os.environ.get("GGML_CPU_TILED_MM_FORCE"))
    if found != expected:
        raise MeshbenchError(
            f"engine.tiled_mm {tiled_mm}: this process has GGML_CPU_TILED_MM={found[0]} and "
            f"GGML_CPU_TILED_MM_FORCE={found[1]} in its environment; unset them (meshbench sets "
            "them for an engine process of its own)"
        )


def _rpc_record(model: LoadedModel, spec: EngineSpec, context_log: list[str]) -> dict:
    """The topology results.json records: endpoints, devices, the layers and buffers each holds (as
    llama.cpp logged them at load; KV buffers for a one-sequence probe context). Not in the recipe
    fingerprint: the tokens are checked to be the same with and without workers."""
    t = topology([*model.load_log, *context_log])
    return {
        "endpoints": [str(e) for e in model.endpoints],
        "spawned": spec.workers > 0,
        "protocol": model.protocols,
        "devices": model.device_names,
        "split": None if spec.split is None else list(spec.split),
        "layers": t["layers"],
        "buffers": t["buffers"],
    }
