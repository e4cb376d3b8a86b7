"""A results.json typed once, after it passed its schema: its records, and its config echo as the RunConfig
it ran (``meshbench.workload.config.from_mapping``). verify, the README renderers and compare read these,
never the JSON's keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshbench.records import serial
from meshbench.records.context import EngineInfo
from meshbench.records.documents import EndpointResults, NodeResults
from meshbench.records.model import LevelRecord
from meshbench.workload import config
from meshbench.workload.config import RunConfig


@dataclass(frozen=True, slots=True)
class NodeBundle:
    """A node sweep's results: the records and the config they ran."""

    results: NodeResults
    cfg: RunConfig

    @property
    def levels(self) -> list[LevelRecord]:
        return self.results.levels

    @property
    def engine(self) -> EngineInfo:
        """The engine meshbench ran."""
        return self.results.engine

    @property
    def wall(self) -> bool:
        return self.cfg.clock == "wall"

    @property
    def arrival_sweep(self) -> bool:
        """Sessions arrived over time (a process, or rates), rather than all before the first tick."""
        return any(lv.arrivals != "all-at-once" for lv in self.results.levels)

    @property
    def tokens_drive_schedule(self) -> bool:
        """A session's end (eos stop), or which positions a prefix cache holds (later turns' prompts carry the
        answers), follows from the tokens' values; elsewhere the schedule depends on lengths alone."""
        w = self.cfg.workload
        return w.eos == "stop" or (w.turns > 1 and bool(self.cfg.engine.prefix_cache))


@dataclass(frozen=True, slots=True)
class EndpointBundle:
    """An endpoint sweep's results: the records and the config they ran."""

    results: EndpointResults
    cfg: RunConfig

    @property
    def engine(self) -> None:
        """None: the server's engine is its own (what it says of itself is its results' ``endpoint``)."""
        return None


def node(data: Any) -> NodeBundle:
    return node_bundle(serial.node_results(data))


def endpoint(data: Any) -> EndpointBundle:
    return endpoint_bundle(serial.endpoint_results(data))


# A sweep's own records, as it built them (no trip through JSON within the process that ran it), with its config
# echo read as a RunConfig as a results.json's is.
def node_bundle(results: NodeResults) -> NodeBundle:
    return NodeBundle(results, config.from_mapping(results.config, "results.json config"))


def endpoint_bundle(results: EndpointResults) -> EndpointBundle:
    return EndpointBundle(results, config.from_mapping(results.config, "results.json config"))
