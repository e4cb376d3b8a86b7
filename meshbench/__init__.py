"""meshbench: reproducible evidence for continuous batching and bounded admission."""

__version__ = "0.1.0"
