"""The node-local scheduler: admission, continuous batching, telemetry.

It works on session ids, positions and token ids only; it never touches arrays.
"""
