"""A config file read strictly: one YAML mapping, no aliases, no repeated keys, nothing JSON cannot hold; and
the deep merge of command-line overrides into it."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from meshbench import files, validation
from meshbench.errors import MeshbenchError

MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; 1 MiB holds 100000 per-session entries


class _StrictLoader(yaml.SafeLoader):
    """safe_load without aliases (no alias bombs) and without silently repeated keys."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not allowed in a config", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    text = files.read_text(p, "config", MAX_CONFIG_BYTES)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise MeshbenchError(f"config {p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise MeshbenchError(f"config {p}: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MeshbenchError(f"config {p}: expected a mapping at the top level, got {type(data).__name__}")
    bad = validation.unrepresentable(data)
    if bad:
        raise MeshbenchError(f"config {p}: {bad}")
    engine = data.get("engine")
    if isinstance(engine, dict) and engine.get("tiled_mm") is False:
        engine["tiled_mm"] = "off"  # YAML 1.1 reads an unquoted off as false; the docs write it so
    if isinstance(engine, dict) and isinstance(engine.get("cache_prompt"), bool):
        engine["cache_prompt"] = "on" if engine["cache_prompt"] else "off"  # (likewise on and off)
    workload = data.get("workload")
    if isinstance(workload, dict) and workload.get("cancel") is False:
        workload["cancel"] = "off"  # (likewise)
    return data


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
