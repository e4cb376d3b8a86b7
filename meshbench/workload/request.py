"""What every request of an endpoint sweep asks of the server beside its prompt and token counts, by API: one
definition for the client that sends it (meshbench.endpoint.client) and for verify, which holds a bundle's
record of it (``workload.request``) to the config.

Nothing is sent that changes the server's own behaviour beyond the decoding (greedy, unless ``engine.temperature``
and ``engine.top_p`` choose sampling) and the eos policy: ``cache_prompt`` only where the user chose it
(``engine.cache_prompt``)."""

from __future__ import annotations

from meshbench.engine import apis, spec
from meshbench.engine.spec import EngineSpec


def shared_fields(
    api: str, ban_eos: bool, seed: int, cache_prompt: bool | None, sampling: EngineSpec | None = None
) -> dict:
    """The fields every request of the sweep carries (``api``: native, or openai and chat alike): greedy, unless
    ``sampling`` (an endpoint's settings) sets a temperature; then its temperature, and each sampler it sets
    (``spec.samplers``: top_p where below 1, ...), the server's other samplers at their defaults."""
    temperature = sampling.temperature if sampling is not None else 0.0
    nucleus = spec.samplers(sampling) if sampling is not None and temperature else {}
    if apis.of(api).ids:
        greedy = {"top_k": DRAW_TOP_K} if temperature else {"top_k": 1}  # (sampled: llama.cpp's default, pinned)
        body: dict = {"temperature": temperature, **greedy, **nucleus, "ignore_eos": ban_eos, "return_tokens": True}
        body.update(stream=True, seed=seed)
    else:
        body = {"temperature": temperature, **nucleus, "seed": seed, "stream": True}
        body["stream_options"] = {"include_usage": True}
        if ban_eos:
            body["ignore_eos"] = True  # llama-server (llama-cpp-python's server reads min_tokens)
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    return body


# Sampled over the native API, top-k is sent at llama.cpp's default, so that a token's candidates are sorted, best
# first, when its draw walks them, and the margin passes ask for all of them (meshbench.analysis.draws).
DRAW_TOP_K = 40
MAX_SEED = 2**32 - 2  # the largest seed a request carries: a 32-bit seed, and not llama.cpp's "random" 0xFFFFFFFF


def session_seed(seed: int, k: int, per_request: bool) -> int:
    """The seed session ``k`` (0-based) carries: ``seed + k`` with ``engine.seed_per_request``, else ``seed``."""
    return seed + k if per_request else seed


def chosen_cache_prompt(setting: str | None) -> bool | None:
    """``engine.cache_prompt`` (on | off | None) as the field sent (None: not sent)."""
    return None if setting is None else setting == "on"


def logprobs(api: str, k: int) -> dict:
    """The fields that ask for the top ``k`` log-probabilities per token: native ``n_probs``, the OpenAI
    completions API's ``logprobs``, the chat API's ``logprobs`` and ``top_logprobs``."""
    return apis.of(api).probs(k)


def drawn_probs(k: int) -> dict:
    """The fields that ask llama-server's native API for each token's top ``k`` candidates after the samplers,
    with their probabilities (the ones its draw walked: meshbench.analysis.draws)."""
    return {**apis.NATIVE.probs(k), "post_sampling_probs": True}
