"""What every request of an endpoint sweep asks of the server beside its prompt and token counts, by API: one
definition for the client that sends it (meshbench.endpoint.client) and for verify, which holds a bundle's
record of it (``workload.request``) to the config.

Nothing is sent that changes the server's own behaviour beyond greedy decoding and the eos policy:
``cache_prompt`` only where the user chose it (``engine.cache_prompt``)."""

from __future__ import annotations

from meshbench.engine import apis


def shared_fields(api: str, ban_eos: bool, seed: int, cache_prompt: bool | None) -> dict:
    """The fields every request of the sweep carries (``api``: native, or openai and chat alike)."""
    if apis.of(api).ids:
        body: dict = {"temperature": 0.0, "top_k": 1, "ignore_eos": ban_eos, "return_tokens": True}
        body.update(stream=True, seed=seed)
    else:
        body = {"temperature": 0.0, "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
        if ban_eos:
            body["ignore_eos"] = True  # llama-server (llama-cpp-python's server reads min_tokens)
    if cache_prompt is not None:
        body["cache_prompt"] = cache_prompt
    return body


def chosen_cache_prompt(setting: str | None) -> bool | None:
    """``engine.cache_prompt`` (on | off | None) as the field sent (None: not sent)."""
    return None if setting is None else setting == "on"


def logprobs(api: str, k: int) -> dict:
    """The fields that ask for the top ``k`` log-probabilities per token: native ``n_probs``, the OpenAI
    completions API's ``logprobs``, the chat API's ``logprobs`` and ``top_logprobs``."""
    return apis.of(api).probs(k)
