"""One source for the config: the dataclasses' defaults are the embedded defaults, the schema names exactly
their fields, and the rules that tie fields together live in the dataclasses."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from meshbench.engine.spec import EngineSpec
from meshbench.errors import MeshbenchError
from meshbench.scheduler.budget import NodeBudget
from meshbench.workload import config

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json").read_text())


def names(cls, skip=()) -> set[str]:
    return {f.name for f in fields(cls)} - set(skip)


@pytest.mark.parametrize(
    "section,cls,skip",
    [
        (None, config.RunConfig, ("source",)),  # where the config came from: not a key anyone writes
        ("engine", EngineSpec, ("ban_eog",)),  # derived from workload.eos
        ("workload", config.WorkloadSection, ()),
        ("budget", NodeBudget, ()),
    ],
)
def test_the_schema_names_exactly_the_dataclass_fields(section, cls, skip):
    props = SCHEMA["properties"] if section is None else SCHEMA["properties"][section]["properties"]
    assert set(props) == names(cls, skip)
    defaults = config.DEFAULTS if section is None else config.DEFAULTS[section]
    assert set(defaults) == names(cls, skip)


def test_the_embedded_defaults_are_the_dataclass_defaults_and_valid():
    from meshbench import validation

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
        ({"repack": True}, "need the gguf engine"),
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
    with pytest.raises(MeshbenchError, match="workload.eos stop needs the gguf engine"):
        config.RunConfig(workload=wl)
