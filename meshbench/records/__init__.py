"""The records results.json holds: the typed model (``model``) and the one module that knows their JSON keys
(``serial``)."""

from meshbench.records.legacy import LevelRecord, SessionRecord, SessionTiming, SubmitEvent, TickDict
from meshbench.records.model import JsonObject

__all__ = ["JsonObject", "LevelRecord", "SessionRecord", "SessionTiming", "SubmitEvent", "TickDict"]
