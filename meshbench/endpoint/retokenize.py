"""An endpoint bundle's prompts tokenized here, by the model file its config names, for verify to hold the prompt
ids the bundle records to: every sibling, margin and canary check rests on those ids, and the server gave them
(a forger who edits them, and the records they lead to, would otherwise pass). Where the model or the prompts are
not here, the reason instead: verify notes the ids unchecked.

The tokenizer runs in a throwaway process: the model file is named by a bundle, which can come from anyone, and
llama.cpp aborts its process on some malformed vocabularies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from meshbench import files
from meshbench.engine import packaged
from meshbench.errors import MeshbenchError
from meshbench.results.typed import EndpointBundle
from meshbench.sweep.run import locate
from meshbench.workload import prompts as prompts_mod

TIMEOUT_S = 300.0  # a vocabulary load and a few thousand prompts' tokenization take seconds
# Answers given in this process, by the model file's identity (path, inode, size, modification time) and what was
# asked: a verify of several bundles of one model and prompts starts one child, not one a bundle (2 s each).
_ANSWERS: dict[tuple, list[list[int]] | str] = {}


def here(b: EndpointBundle, bundle: Path | None = None) -> list[list[int]] | str:
    """The bundle's prompts as the model it names tokenizes them here (BOS as the model says, special-token text
    read as the server's tokenizer reads it), or why they cannot be: a model the server chose (a ``--target``), a
    model or prompts file that is not here, a prompts file that is not the one the bundle recorded, a model that
    is not the one the server loaded, or a vocabulary llama.cpp cannot read. A relative prompts file is looked for
    from here, then from the bundle's folder upwards; a model path is taken as given."""
    eng, wl, launched = b.cfg.engine, b.results.workload, b.results.endpoint.launched
    if not eng.package and not eng.model:
        return "the config names no model: the server's own"
    try:
        # a packaged model is checked by its sha256 (packaged.path); any other file by llama.cpp's loader's own
        # checks, in the child, and its weights' (gguf_io.check_model_file)
        model = packaged.path(eng.package) if eng.package else files.regular_file(eng.model or "", "engine.model")
        if launched is not None and launched.model != model.name:
            return f"the server loaded {launched.model!r}, not the config's model {model.name!r}"
        at = files.regular_file(locate(wl.prompts, bundle) if bundle is not None else wl.prompts, "workload.prompts")
        if files.sha256(at) != wl.prompts_sha256:
            return f"workload.prompts {wl.prompts}: not the file the bundle recorded (its sha256 differs)"
        texts = prompts_mod.read(str(at), wl.turns or 1)[: wl.sessions]
        later = prompts_mod.later_turns(prompts_mod.read_entries(str(at)), wl.turns or 1, str(at)) or []
        return _tokenized(model, texts, [t for x in later[: wl.sessions] for t in x], checked=bool(eng.package))
    except (MeshbenchError, OSError, ValueError) as e:  # (ValueError: a path with a NUL in it)
        return str(e)


def _tokenized(model: Path, texts: list[str], later: list[str], checked: bool) -> list[list[int]] | str:
    """The prompts' ids, then a conversation's later turns' (nothing special added: each continues its
    conversation), session by session."""
    st = model.stat()
    key = (str(model.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, tuple(texts), tuple(later), checked)
    if key not in _ANSWERS:
        _ANSWERS[key] = _child_answer(model, texts, later, checked)
    answer = _ANSWERS[key]
    return answer if isinstance(answer, str) else [list(ids) for ids in answer]


def _child_answer(model: Path, texts: list[str], later: list[str], checked: bool) -> list[list[int]] | str:
    """The throwaway process's answer: the ids, or the one-line reason there are none."""
    code = "from meshbench.endpoint.retokenize import child; child()"
    request = json.dumps({"model": str(model.resolve()), "texts": texts, "later": later, "checked": checked})
    try:
        with tempfile.TemporaryDirectory() as empty:  # (isolated, in an empty folder: no module of the caller's
            # folder can stand in for one the child imports)
            done = subprocess.run(
                [sys.executable, "-I", "-c", code],
                input=request,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                cwd=empty,
            )
    except subprocess.TimeoutExpired:
        return f"model {model}: tokenizing the prompts took over {TIMEOUT_S:.0f} s"
    if done.returncode < 0:
        return f"model {model}: llama.cpp died reading its vocabulary ({signal.Signals(-done.returncode).name})"
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"model {model}: the tokenizer did not answer ({last[:200]})"
    if "error" in answer:
        return str(answer["error"])
    return answer["ids"] + answer["later"]


def child() -> None:
    """The throwaway process: a request on stdin, the ids (or the one-line reason) on stdout."""
    from meshbench.engine.llama_model import tokenize

    request = json.loads(sys.stdin.read())
    try:
        ids = tokenize(request["model"], request["texts"], special=True, check_file=not request["checked"])
        later = tokenize(request["model"], request["later"], bos=False, special=True, check_file=False)
        print(json.dumps({"ids": [list(x) for x in ids], "later": [list(x) for x in later]}))
    except MeshbenchError as e:
        print(json.dumps({"error": str(e)}))
