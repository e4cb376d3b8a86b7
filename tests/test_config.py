"""One source for the config: the dataclasses' defaults are the embedded defaults, the schema names exactly
their fields, and the rules that tie fields together live in the dataclasses."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from meshbench import validation
from meshbench.engine import spec as engine_spec
from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.records.context import Budget
from meshbench.workload import config

SCHEMA = validation.load("config.schema.json")
FILE = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json").read_text())


def names(cls, skip=()) -> set[str]:
    return {f.name for f in fields(cls)} - set(skip)


@pytest.mark.parametrize(
    "section,cls,skip",
    [
        (None, config.RunConfig, ("source",)),  # where the config came from: not a key anyone writes
        ("engine", EngineSpec, ("ban_eog",)),  # derived from workload.eos
        ("workload", config.WorkloadSection, ()),
        ("budget", Budget, ()),
    ],
)
def test_the_schema_names_exactly_the_dataclass_fields(section, cls, skip):
    props = SCHEMA["properties"] if section is None else SCHEMA["properties"][section]["properties"]
    assert set(props) == names(cls, skip)
    defaults = config.DEFAULTS if section is None else config.DEFAULTS[section]
    assert set(defaults) == names(cls, skip)


def test_the_schema_file_s_engine_section_is_the_engine_spec_s_settings():
    assert FILE["properties"]["engine"]["properties"] == engine_spec.properties(), (
        "schemas/config.schema.json is stale: python -m meshbench.engine.spec"
    )
    assert SCHEMA["properties"]["engine"]["additionalProperties"] is False


def test_the_embedded_defaults_are_the_dataclass_defaults_and_valid():
    assert validation.errors(config.DEFAULTS, "config.schema.json") == []
    cfg = config.load()
    assert cfg.warmup == config.RunConfig.__dataclass_fields__["warmup"].default == config.DEFAULTS["warmup"] == 1
    assert cfg.engine == EngineSpec() and cfg.budget == config.DGR_012_BUDGET
    assert cfg.workload == config.WorkloadSection().build("defaults")
    assert (cfg.story, cfg.levels) == ("DGR-012", (1, 2, 4, 8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"kind": "gguf"}, "engine.kind gguf needs engine.model"),
        ({"repack": True}, "engine.repack needs the gguf engine"),
        ({"mixed_batch": True}, "engine.mixed_batch needs the gguf engine \\(one llama_decode per tick\\)"),
        ({"kind": "endpoint", "url": "http://127.0.0.1:1", "threads": 2}, "engine.threads builds an engine of"),
        ({"allow_remote": True}, "engine.allow_remote is an endpoint's"),
        ({"kind": "endpoint", "url": "http://127.0.0.1:1", "model": "m.gguf"}, "engine.model builds an engine"),
        ({"kind": "nothing"}, "engine.kind 'nothing' is none of synthetic, gguf, endpoint"),
        ({"kind": "gguf", "model": "m.gguf", "rpc": "127.0.0.1:1", "workers": 1}, "not both"),
        ({"kind": "gguf", "model": "m.gguf", "workers": 2, "split": (1.0,)}, "engine.split has 1 shares for 2"),
        ({"kind": "gguf", "model": "m.gguf", "tiled_mm": "off", "isolate": False}, "process-wide"),
    ],
)
def test_an_engine_spec_refuses_what_cannot_run_wherever_it_is_built(kwargs, message):
    with pytest.raises(MeshbenchError, match=message):
        EngineSpec(**kwargs)


def test_a_run_config_refuses_real_prompts_on_the_synthetic_engine():
    wl = config.WorkloadSection(sessions=2, prompts="p.txt").build("test")
    expect = r"workload.prompts \(--prompts\) are real text.*--engine gguf --model FILE"
    with pytest.raises(MeshbenchError, match=expect):
        config.RunConfig(workload=wl)


def test_an_engine_option_is_one_field_everything_else_derives_from_it():
    """Adding an engine option is one EngineSpec field: its schema, flag, help, kind rule and echo default follow
    (here a field added to a subclass, run through the same derivations)."""
    import dataclasses

    import typer
    from typer.testing import CliRunner

    from meshbench.cli import options_engine
    from meshbench.engine.spec import GGUF, setting

    knob = setting(3, GGUF, {"type": "integer", "minimum": 0, "maximum": 9}, "--knob", "A new knob.", added=True)
    spec = dataclasses.make_dataclass("Spec", [("knob", int, knob)], bases=(EngineSpec,), frozen=True, slots=True)
    assert engine_spec.properties(spec)["knob"] == {"type": "integer", "minimum": 0, "maximum": 9}
    assert [f.name for f in engine_spec.settings(spec)][-1] == "knob"
    row = options_engine._row(engine_spec.settings(spec)[-1])
    assert (row.flag, row.paths, row.option.help, row.option.max) == ("--knob", ("engine.knob",), "A new knob.", 9)
    with pytest.raises(MeshbenchError, match="engine.knob needs the gguf engine"):
        spec(knob=4)  # the synthetic engine's: not its setting
    assert spec(kind="gguf", model="m.gguf", knob=4).knob == 4
    assert spec().knob == 3 and spec(knob=3).kind == "synthetic"  # its default is no setting of another kind
    seen = {}
    app = typer.Typer()

    @app.command()
    def cmd(knob: row.annotated = None) -> None:
        seen["knob"] = knob

    assert CliRunner().invoke(app, ["--knob", "5"]).exit_code == 0 and seen == {"knob": 5}
    assert CliRunner().invoke(app, ["--knob", "10"]).exit_code == 2  # bounded by its schema
    assert "knob" in engine_spec.added(spec)


def test_adding_an_engine_option_is_one_field_and_its_flag_schema_and_owner_follow_from_it():
    """Issue 30's measure: one EngineSpec field is the whole hand-written declaration. Its CLI row (typed and
    bounded by its schema), its config schema entry and the rule that refuses it for another engine kind all
    come from it; the two committed generated files (the schema's engine section, docs/reference/cli.md) are
    written from it by the commands their tests name."""
    import dataclasses

    import jsonschema
    import typer
    from typer.testing import CliRunner

    from meshbench.cli import options_engine

    knob = {"type": "integer", "minimum": 0, "maximum": 8, "description": "A new knob of the gguf engine."}
    extended = dataclasses.make_dataclass(
        "Extended",
        [("knob", int, engine_spec.setting(0, engine_spec.GGUF, knob, "--knob"))],
        bases=(EngineSpec,),
        frozen=True,
        slots=True,
    )
    assert engine_spec.properties(extended)["knob"] == knob
    (field,) = [f for f in engine_spec.settings(extended) if f.name == "knob"]
    row = options_engine._row(field)
    assert row.paths == ("engine.knob",) and row.option.help == knob["description"]
    app = typer.Typer()

    @app.command()
    def sweep(knob: row.annotated = None) -> None:  # type: ignore[valid-type]
        print(f"knob={knob}")

    assert CliRunner().invoke(app, ["--knob", "3"]).output == "knob=3\n"
    assert CliRunner().invoke(app, ["--knob", "9"]).exit_code == 2  # (bounded by its schema)
    section = {"type": "object", "additionalProperties": False, "properties": engine_spec.properties(extended)}
    jsonschema.validate({"kind": "gguf", "knob": 3}, section)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"knob": 9}, section)
    assert extended(kind="gguf", model="m.gguf", knob=3).knob == 3  # (every rule runs when a spec is made)
    with pytest.raises(MeshbenchError, match="engine.knob needs the gguf engine"):
        extended(knob=3)
