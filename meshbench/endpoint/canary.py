"""One level's canary run (meshbench.analysis.canary): the first C sessions sent at once, each prompt its own
code repeated, each request otherwise as the sweep sends it (its token count, its eos policy, nothing else
changed: the server's prompt cache as its users run it)."""

from __future__ import annotations

from meshbench.analysis import canary as plant
from meshbench.endpoint.client import Endpoint
from meshbench.endpoint.load import Job, at_once
from meshbench.engine import apis
from meshbench.records import serial
from meshbench.records.canary import CanaryRun


def canary_run(endpoint: Endpoint, jobs: list[Job], codes: list[str], ids: list[list[int]], use_ids: bool) -> CanaryRun:
    """The first ``len(codes)`` sessions at once, each carrying its code (``ids``: each code's ids, from
    ``code_ids``; ``use_ids``: the sweep's ids are fit to search by, meshbench.analysis.canary.ids_usable)."""
    batch = jobs[: len(codes)]
    texts = [plant.prompt_text(code) for code in codes]
    prompts = endpoint.tokenize(texts) if apis.of(endpoint.api).ids else [[] for _ in texts]
    sent = [Job(j.session_id, _with_prompt(endpoint.api, j.body, p, t)) for j, p, t in zip(batch, prompts, texts)]
    done = [serial.completion(x.to_dict()) for x in at_once(endpoint, sent)]
    return plant.run_record([j.session_id for j in batch], codes, ids, prompts, done, use_ids)


def sweep_ids(endpoint: Endpoint, codes: dict[int, list[str]]) -> dict[int, list[list[int]]]:
    """Every code's ids, level by level (native API; [] each over a text API, which searches text only)."""
    native = apis.of(endpoint.api).ids
    return {c: [code_ids(endpoint, code) if native else [] for code in level] for c, level in codes.items()}


def code_ids(endpoint: Endpoint, code: str) -> list[int]:
    """The code's ids as the server tokenizes it after a space mid-prompt (as every repeat after the first is):
    the ids of ``code code`` after those of ``code``; [] where the tokenizer does not split it so."""
    one, two = endpoint.tokenize([code, f"{code} {code}"])
    return two[len(one) :] if two[: len(one)] == one and len(two) > len(one) else []


def _with_prompt(api: str, body: dict, ids: list[int], text: str) -> dict:
    if apis.of(api).ids:
        return {**body, "prompt": ids}
    if apis.of(api).messages:
        return {**body, "messages": [{"role": "user", "content": text}]}
    return {**body, "prompt": text}
