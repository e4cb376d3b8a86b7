"""An endpoint bundle's prompts tokenized here, by the model file its config names, for verify to hold the prompt
ids the bundle records to: every sibling, margin and canary check rests on those ids, and the server gave them
(a forger who edits them, and the records they lead to, would otherwise pass). Where the model or the prompts are
not here, the reason instead: verify notes the ids unchecked."""

from __future__ import annotations

from pathlib import Path

from meshbench import files
from meshbench.engine import packaged
from meshbench.engine.llama_model import tokenize
from meshbench.errors import MeshbenchError
from meshbench.results.typed import EndpointBundle
from meshbench.sweep.run import locate
from meshbench.workload import prompts as prompts_mod


def here(b: EndpointBundle, bundle: Path | None = None) -> list[list[int]] | str:
    """The bundle's prompts as the model it names tokenizes them here (BOS as the model says, special-token text
    read as the server's tokenizer reads it), or why they cannot be: a model the server chose (a ``--target``), one
    the bundle says how to make (never made for this), a model or prompts file that is not here, or a prompts file
    that is not the one the bundle recorded. A relative path is looked for from here, then from the bundle's
    folder upwards."""
    eng, wl = b.cfg.engine, b.results.workload
    if eng.make_model:
        return "its model is one the bundle says how to make, never made to verify it"
    if not eng.package and not eng.model:
        return "the config names no model: the server's own"
    try:
        model = str(packaged.path(eng.package)) if eng.package else _located(eng.model or "", bundle)
        prompts = files.regular_file(_located(wl.prompts, bundle), "workload.prompts")
        if files.sha256(prompts) != wl.prompts_sha256:
            return f"workload.prompts {wl.prompts}: not the file the bundle recorded (its sha256 differs)"
        texts = prompts_mod.read(str(prompts))[: wl.sessions]
        return [list(ids) for ids in tokenize(model, texts, special=True)]
    except (MeshbenchError, OSError) as e:
        return str(e)


def _located(name: str, bundle: Path | None) -> str:
    return locate(name, bundle) if bundle is not None else name
