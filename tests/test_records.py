"""The typed result model against the results schema, both ways, and against every committed bundle: each
record's fields are exactly its schema object's properties (the required ones exactly the fields without a
default), every committed node bundle's levels go from JSON to records and back unchanged, and a value of
the wrong type or a key no record has is refused in one line naming the record."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path

import factories as f
import pytest

from meshbench.errors import MeshbenchError
from meshbench.records import (
    canary,
    cancel,
    context,
    conversation,
    documents,
    endpoint_figures,
    hunt,
    margins,
    matrix,
    model,
    open_loop,
    perturbation,
    serial,
    sharing,
    tick,
)

ROOT = Path(__file__).parent.parent
SCHEMA = json.loads((ROOT / "schemas" / "results.schema.json").read_text())
ENDPOINT = json.loads((ROOT / "schemas" / "endpoint.schema.json").read_text())
HUNT = json.loads((ROOT / "schemas" / "hunt.schema.json").read_text())
MATRIX = json.loads((ROOT / "schemas" / "matrix.schema.json").read_text())
CONFIG = json.loads((ROOT / "schemas" / "config.schema.json").read_text())


def _node(path: str) -> dict:
    """The schema object at ``path``: a $defs name (else a top-level property), then properties, ``[]`` for
    items, ``*`` for values. ``endpoint:`` (``hunt:``) before it reads the endpoint (hunt) schema; ``results:``
    starts at the node schema's top-level properties; either alone is the whole schema."""
    schema, rest = (ENDPOINT, path.removeprefix("endpoint:")) if path.startswith("endpoint:") else (SCHEMA, path)
    if path.startswith("hunt:"):
        schema, rest = HUNT, path.removeprefix("hunt:")
    if path.startswith("matrix:"):
        schema, rest = MATRIX, path.removeprefix("matrix:")
    if path.startswith("config:"):  # (a config section's record: config.schema.json)
        schema, rest = CONFIG, path.removeprefix("config:")
    top = rest.startswith("results:")  # (a node's top-level property, where a $defs name is the same)
    rest = rest.removeprefix("results:")
    if not rest:
        return schema
    parts = rest.split(".")
    node = _resolve(
        schema,
        schema["properties"][parts[0]] if top or parts[0] not in schema.get("$defs", {}) else schema["$defs"][parts[0]],
    )
    for p in parts[1:]:
        if p == "[]":
            node = node["items"]
        elif p == "*":
            node = node["additionalProperties"]
        else:
            node = node["properties"][p]
        node = _resolve(schema, node)
    return node


def _resolve(schema: dict, node: dict) -> dict:
    """A $ref followed (within the schema), and of a record-or-null, the record."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].split("/")[-1]]
    objects = [n for n in node.get("oneOf", []) if n.get("type") == "object"]
    return objects[0] if objects else node


RECORDS = {
    model.SessionRecord: "session",
    model.Timing: "session_timing",
    tick.Tick: "timed_tick_record",
    model.SubmitEvent: "level.submit_events.[]",
    model.Percentiles: "percentiles",
    model.WallFigures: "wall",
    model.Summary: "summary",
    model.WallSummary: "level.wall",
    model.Repetition: "level.repetitions.[]",
    model.PassSession: "isolation_pass.sessions.[]",
    model.IsolationPass: "isolation_pass",
    model.IsolationRecords: "level.isolation",
    model.IsolationVerdict: "level.isolation_verdict",
    model.LevelRecord: "level",
    model.Reference: "reference",
    model.Backpressure: "level.backpressure",
    documents.SweepIsolation: "results:isolation",
    documents.NodeResults: "results:",
    documents.FirstDivergence: "results:first_divergence",
    documents.LogitDeviation: "results:first_divergence.logit_deviation",
    context.SyntheticEngineInfo: "synthetic_engine",
    context.GgufEngineInfo: "gguf_engine",
    context.KvGeometry: "gguf_engine.kv_geometry",
    context.KvAllocation: "gguf_engine.kv_allocated",
    context.Workload: "results:workload",
    context.Budget: "budget",
    context.Slo: "config:slo",
    context.InputFile: "results:inputs.*",
    context.Environment: "results:environment",
    context.Compute: "results:environment.compute",
    context.Blas: "results:environment.compute.blas",
    context.LlamaCppBuild: "results:environment.compute.llama_cpp",
    documents.EndpointResults: "endpoint:",
    documents.EndpointVerdicts: "endpoint:verdicts",
    documents.NeedleVerdict: "endpoint:verdicts.needle.*",
    documents.Needle: "endpoint:needle",
    context.EndpointInfo: "endpoint:endpoint",
    context.Launched: "endpoint:endpoint.launched",
    context.EndpointWorkload: "endpoint:workload",
    model.Resubmission: "level.engine_losses.[].resubmitted.[]",
    model.FaultSession: "level.fault_events.[].sessions.[]",
    model.FaultEvent: "level.fault_events.[]",
    model.EngineLoss: "level.engine_losses.[]",
    model.Completion: "endpoint:completion",
    margins.MarginPasses: "endpoint:margins",
    margins.Divergence: "endpoint:divergence",
    margins.LevelDivergences: "endpoint:divergences.levels.*",
    margins.Divergences: "endpoint:divergences",
    perturbation.Perturbation: "endpoint:perturbation",
    perturbation.PerturbationRun: "endpoint:perturbation.runs.[]",
    perturbation.PerturbationVerdict: "endpoint:perturbation.verdict",
    canary.CanaryRun: "endpoint:canary_run",
    cancel.CancelRun: "endpoint:cancel_run",
    cancel.CancelVerdict: "endpoint:cancel_run.verdict",
    canary.CanaryHit: "endpoint:canaries.hits.[]",
    canary.CanarySearch: "endpoint:canaries",
    model.GaugeSample: "endpoint:gauge_sample",
    model.EndpointRepetition: "endpoint:repetition",
    model.NeedleTrial: "endpoint:needle_trial",
    model.EndpointLevel: "endpoint:level",
    open_loop.EndpointRate: "endpoint:rate",
    conversation.ConversationCold: "endpoint:conversations",
    sharing.PrefixStats: "level.prefix",
    sharing.CacheVerdict: "level.cache_verdict",
    sharing.CacheDivergence: "level.cache_verdict.divergences.[]",
    sharing.OwnKvReplay: "level.cache_verdict.own_kv",
    context.SharedPrefix: "results:workload.prefix",
    endpoint_figures.PassFigures: "endpoint:figures",
    endpoint_figures.LevelFigures: "endpoint:summary",
    endpoint_figures.Spread: "endpoint:summary.tokens_per_s",
    hunt.HuntDocument: "hunt:",
    hunt.HuntServer: "hunt:server",
    hunt.HuntBudget: "hunt:budget",
    hunt.Calibration: "hunt:calibration",
    hunt.Run: "hunt:run",
    hunt.FindingRecord: "hunt:findings.[]",
    hunt.HuntSummary: "hunt:summary",
    hunt.Coverage: "hunt:summary.coverage.*",
    matrix.MatrixDocument: "matrix:",
    matrix.MatrixEntry: "matrix:settings.[]",
}


def test_every_record_of_the_model_is_mapped_to_the_schema():
    defined = {
        v
        for m in serial.MODULES
        for v in vars(m).values()
        if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == m.__name__
    }
    defined.discard(context.EngineInfo)  # (what both engine kinds' records share: no schema object of its own)
    defined.discard(endpoint_figures.Figure)  # (what a figure is: its records' fields declare it, not a record)
    assert defined == set(RECORDS)


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
def test_a_record_has_exactly_its_schema_keys(cls):
    node = _node(RECORDS[cls])
    keys = {f.metadata.get("json", f.name): f for f in dataclasses.fields(cls)}  # (a field may name its own key)
    assert [k for k in keys if k not in node["properties"]] == []
    assert [k for k in node["properties"] if k not in keys] == []
    missing = dataclasses.MISSING
    required = {k for k, f in keys.items() if f.default is missing and f.default_factory is missing}
    # (a tick's times are required where a tick is timed, and absent where it is not: the next test)
    least = _node("tick_record") if cls is tick.Tick else node
    assert required == set(least.get("required", least["properties"]))


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
def test_the_schema_refuses_every_key_a_record_does_not_have(cls):
    # (so a file that passed the schema always builds its records: a forged key is the schema's one-line error)
    assert _node(RECORDS[cls]).get("additionalProperties") is False


def test_a_record_is_written_in_its_field_order():
    timed = f.tick_record(tick_ns=5, decode_ns=1, prefill_ns=2, prefix_hit_tokens=0, kv_bytes_shared=0)
    assert list(serial.to_json(timed)) == [field.name for field in dataclasses.fields(tick.Tick)]
    assert "tick_ns" not in serial.to_json(f.tick_record())


def test_a_deterministic_tick_is_a_timed_one_without_its_times():
    timed, plain = _node("timed_tick_record"), _node("tick_record")
    optional = {f.name for f in dataclasses.fields(tick.Tick) if f.default is None}
    shared = {"prefix_hit_tokens", "kv_bytes_shared"}  # (a prefix cache's: in both, where there is one)
    assert set(timed["properties"]) - set(plain["properties"]) == optional - shared


def _committed(kinds: tuple) -> list:
    """The committed bundles of these kinds (a node's has none), a settings matrix's settings too."""
    found = [*(ROOT / "evidence").glob("*/results.json"), *(ROOT / "evidence").glob("*/*/results.json")]
    return sorted(p for p in found if json.loads(p.read_text()).get("kind") in kinds)


NODE_BUNDLES = _committed((None,))
ENDPOINT_BUNDLES = _committed(("endpoint",))


@pytest.mark.parametrize("path", ENDPOINT_BUNDLES, ids=lambda p: str(p.parent.relative_to(ROOT / "evidence")))
def test_every_committed_endpoint_bundle_goes_to_records_and_back_unchanged(path):
    data = json.loads(path.read_text())
    assert serial.to_json(serial.endpoint_results(data)) == data


@pytest.mark.parametrize("path", NODE_BUNDLES, ids=lambda p: p.parent.name)
def test_every_committed_node_bundle_goes_to_records_and_back_unchanged(path):
    data = json.loads(path.read_text())
    assert serial.to_json(serial.from_json(data, documents.NodeResults)) == data


@pytest.mark.parametrize("path", NODE_BUNDLES, ids=lambda p: p.parent.name)
def test_every_committed_level_goes_to_records_and_back_unchanged(path):
    data = json.loads(path.read_text())
    for level in data["levels"]:
        record = serial.from_json(level, model.LevelRecord)
        assert isinstance(record.tick_records[0], tick.Tick)
        assert serial.to_json(record) == level


def test_a_wrong_type_or_an_unknown_key_is_one_line_naming_the_record():
    level = json.loads(NODE_BUNDLES[0].read_text())["levels"][0]
    bad = json.loads(json.dumps(level))
    bad["sessions"][0]["epoch"] = 1.0  # an int field is never coerced
    with pytest.raises(MeshbenchError, match=r"not a LevelRecord record: .*sessions\[0\]\.epoch"):
        serial.from_json(bad, model.LevelRecord)
    bad = json.loads(json.dumps(level))
    bad["tick_records"][0]["forged"] = 1
    with pytest.raises(MeshbenchError, match=r"extra fields found \(forged\)") as e:
        serial.from_json(bad, model.LevelRecord)
    assert "\n" not in str(e.value)
    bad = json.loads(json.dumps(level))
    bad["concurrency"] = True  # a bool is not an int here
    with pytest.raises(MeshbenchError, match="concurrency"):
        serial.from_json(bad, model.LevelRecord)


def test_an_optional_key_is_left_out_when_none_and_numbers_keep_their_type():
    event = model.SubmitEvent(tick=3, session_id="s0", epoch=1, decision="ADMITTED", active=0, queued=0)
    assert serial.to_json(event) == {
        "tick": 3,
        "session_id": "s0",
        "epoch": 1,
        "decision": "ADMITTED",
        "active": 0,
        "queued": 0,
    }
    wall = serial.from_json({**serial.to_json(event), "arrival_ms": 0, "submit_ms": 0.5}, model.SubmitEvent)
    assert wall.arrival_ms == 0 and type(wall.arrival_ms) is int and wall.submit_ms == 0.5


def test_a_map_by_concurrency_is_keyed_by_integers_and_written_by_their_digits():
    data = json.loads(ENDPOINT_BUNDLES[0].read_text())
    v = serial.endpoint_results(data).verdicts
    levels = [lv["concurrency"] for lv in data["levels"]]
    for by_level in (v.failed, v.differing_sessions, v.distinct_outputs, v.needle):
        assert list(by_level) == levels and all(type(c) is int for c in by_level)
    assert serial.to_json(v)["needle"].keys() == data["verdicts"]["needle"].keys()
    for key in ("01", "0", "-1", "1.0", "\u0661", " 1"):  # (one a non-ASCII digit)
        bad = json.loads(json.dumps(data))
        bad["verdicts"]["failed"] = {key: 0}
        with pytest.raises(MeshbenchError, match="is not a concurrency"):
            serial.endpoint_results(bad)


def test_a_map_by_concurrency_is_only_a_fields_own_value_so_it_is_written_by_its_digits():
    """serial writes a dict[int, X] field's keys as digits where the field holds it (not inside a list or another
    map), and a map whose levels are not the document's is refused in one line."""

    def nested(t, top):
        args = typing.get_args(t)
        here = typing.get_origin(t) is dict and args[:1] == (int,)
        inner = [nested(a, top and typing.get_origin(t) in (typing.Union, types.UnionType)) for a in args]
        return (here and not top) or any(inner)

    for cls in serial._records():
        for name, t in typing.get_type_hints(cls).items():
            assert not nested(t, True), f"{cls.__name__}.{name}: a map by concurrency inside another value"
    data = json.loads(ENDPOINT_BUNDLES[0].read_text())
    del data["verdicts"]["needle"][str(data["levels"][0]["concurrency"])]
    with pytest.raises(MeshbenchError, match=r"verdicts.needle: by concurrency \[.*\], not the levels") as e:
        serial.endpoint_results(data)
    assert "\n" not in str(e.value)


MATRIX_BUNDLES = _committed(("matrix",))
TOP_ENDPOINT_BUNDLES = [p for p in ENDPOINT_BUNDLES if p.parent.parent == ROOT / "evidence"]


@pytest.mark.parametrize(
    "path", TOP_ENDPOINT_BUNDLES + MATRIX_BUNDLES, ids=lambda p: str(p.parent.relative_to(ROOT / "evidence"))
)
def test_every_committed_endpoint_and_matrix_bundle_verifies_with_today_s_code(path):
    """(CI verifies them too, with the pins of evidence/OLDER.json; here a change that an older bundle's record no
    longer meets fails the tests: a setting added since a matrix was made is its default in both its echo and its
    settings')"""
    from typer.testing import CliRunner

    from meshbench.cli import app

    r = CliRunner().invoke(app, ["verify", str(path.parent), "--older", str(ROOT / "evidence" / "OLDER.json")])
    assert r.exit_code == 0, r.output[-2000:]


def test_verify_holds_a_figures_record_field_by_field_floats_within_its_tolerance():
    """A recomputed record against the recorded one: a float one ulp off is the same figure (as it was when figures
    were dicts), another value, a None or another type is not."""
    from meshbench.analysis.checks import Checks
    from meshbench.records.endpoint_figures import LevelFigures, Spread

    def level(median: float | None) -> LevelFigures:
        spread = None if median is None else Spread(median=median, min=1.0, max=3.0)
        return LevelFigures(**{f.name: spread for f in dataclasses.fields(LevelFigures)})

    c = Checks()
    c.equal("results.json", "close", level(2.0), level(2.0 + 2e-16))
    assert c.failures == []
    for other in (level(2.1), level(None)):
        c.equal("results.json", "far", level(2.0), other)
    assert len(c.failures) == 2


def test_the_schema_sections_written_from_records_are_the_files():
    """The budget's section in both schema files is what its fields give (``meshbench.records.schemas``)."""
    from meshbench.records import schemas

    assert schemas.stale() == [], "a schema file is stale: python -m meshbench.records.schemas"


def test_a_stale_section_is_named(tmp_path):
    import json

    from meshbench.records import schemas

    for name, _, _ in schemas.SECTIONS:
        (tmp_path / name).write_text((schemas.SCHEMAS / name).read_text())
    schemas.write(tmp_path)
    assert schemas.stale(tmp_path) == []
    data = json.loads((tmp_path / "results.schema.json").read_text())
    data["$defs"]["budget"]["properties"]["kv_bytes"]["minimum"] = 0
    (tmp_path / "results.schema.json").write_text(json.dumps(data))
    assert schemas.stale(tmp_path) == ["results.schema.json: $defs/budget"]
