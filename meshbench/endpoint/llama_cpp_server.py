"""llama-cpp-python's OpenAI-compatible server (the ``server`` extra), run with llama.cpp's CPU weight
repacking as meshbench's own engine has it (``engine.repack``, off by default).

``python -m meshbench.endpoint.llama_cpp_server --model FILE --host 127.0.0.1 --port PORT [...]`` takes
``python -m llama_cpp.server``'s arguments. That server has no setting for repacking, and llama.cpp's default
(on) dies at the first decode where the CPU reports AMX but cannot run it (SIGILL; see docs/guides/gguf.md).
``--repack`` keeps llama.cpp's default. Nothing else of the server is changed: its app, its API, its
scheduling are llama-cpp-python's.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import llama_cpp.llama_cpp as native  # noqa: PLC0415 - the server extra is optional
    from llama_cpp.server.__main__ import main as serve  # noqa: PLC0415

    repack = "--repack" in argv
    sys.argv = [sys.argv[0], *(a for a in argv if a != "--repack")]
    if not repack:
        defaults = native.llama_model_default_params

        def without_repacking():
            params = defaults()
            params.use_extra_bufts = False
            return params

        native.llama_model_default_params = without_repacking
    serve()


if __name__ == "__main__":
    main(sys.argv[1:])
