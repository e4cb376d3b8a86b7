"""The project's one error type for user mistakes.

Raised with a message that names the field or input at fault; only the CLI turns it
into an exit code. Broken internal invariants are assertions, not MeshbenchError.
"""


class MeshbenchError(Exception):
    """A user-facing problem: bad config, bad flag, bad model file, bad bundle."""


class EngineUnavailable(MeshbenchError):
    """An optional engine's dependency (llama-cpp-python, gguf) is not installed."""
