"""The command line: one module per command, with the shared options in ``common``."""

from meshbench.cli.app import app, main

__all__ = ["app", "main"]
