"""The records results.json holds: the typed model (``model``), and the one module that knows their JSON keys
(``serial``)."""

from meshbench.records.model import JsonObject

__all__ = ["JsonObject"]
