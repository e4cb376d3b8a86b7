"""meshbench's exit codes, in one place: the app's --help prints them, README.md's CI section lists them."""

from __future__ import annotations

OK = 0
CHECK_FAILED = 1  # verify (or a sweep's own evidence) found a failing check
BAD_INPUT = 2  # a flag, config, model, bundle or output path that cannot be used: one line on stderr, nothing written
CRASHED = 3  # a bug of meshbench's: one line on stderr naming the log file that holds the traceback
# verify --rerun on other llama.cpp kernels: every check it could make held, but records bound to the recording
# kernels (tokens, and what follows from them) were not reproduced, so nothing confirms them here; 0 only with
# --accept-other-kernels. A forged fingerprint must not turn a token check into a pass.
NOT_REPRODUCED = 4
NOTHING_JUDGED = 5  # hunt: no answer could be held to its cold answer (none came back whole, or without margins)
INTERRUPTED = 130  # SIGINT (Ctrl-C): no partial bundle or file is left
TERMINATED = 143  # SIGTERM: the same

MEANINGS = (
    (OK, "success: every check held"),
    (CHECK_FAILED, "a check failed (verify, or a sweep's own evidence)"),
    (BAD_INPUT, "bad input or unwritable output: one line names it, nothing is written"),
    (CRASHED, "meshbench crashed: one line names the log holding the traceback"),
    (
        NOT_REPRODUCED,
        "verify --rerun: records bound to other llama.cpp kernels not reproduced here (0 with --accept-other-kernels)",
    ),
    (NOTHING_JUDGED, "hunt: no answer could be judged against its cold answer, so nothing was checked"),
    (INTERRUPTED, "interrupted (SIGINT): no partial bundle or file is left"),
    (TERMINATED, "terminated (SIGTERM): the same"),
)


def epilog() -> str:
    """The exit codes as --help shows them (click rewraps an epilog's lines unless a paragraph starts with \\b)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in MEANINGS)
