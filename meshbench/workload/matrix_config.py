"""One setting's sweep of a matrix of server settings, as a config: the matrix's, its server's flags the matrix's
then the setting's, no matrix. The runner runs it; verify holds each setting's config echo to it."""

from __future__ import annotations

import dataclasses

from meshbench.workload import matrix
from meshbench.workload.config import ADDED_KEYS, DEFAULTS, LEGACY_TOP, RunConfig

# What a setting's sweep fills in from the server it ran (its tokenizer's prompt lengths and ids): not the
# matrix's to say, but the same for every setting of one model.
MEASURED = ("prompt_tokens", "prompt_ids")


def setting_config(cfg: RunConfig, flags: str) -> RunConfig:
    engine = dataclasses.replace(
        cfg.engine, server_args=matrix.server_args(cfg.engine.server_args, flags), server_settings=()
    )
    return dataclasses.replace(cfg, engine=engine)


def as_run(echo: dict) -> dict:
    """A config echo without what a setting's sweep measured (MEASURED), to compare one setting's with another's
    or with the matrix's; a key added since the echo was written (config.ADDED_KEYS) is its default where the
    echo lacks it, as it means (a top-level one, config.LEGACY_TOP: what such an echo ran)."""
    filled = {
        section: {**{k: DEFAULTS[section][k] for k in keys if k in DEFAULTS[section]}, **echo[section]}
        for section, keys in ADDED_KEYS.items()
        if isinstance(echo.get(section), dict)
    }
    out = {**LEGACY_TOP, **echo, **filled}
    return {**out, "workload": {k: v for k, v in out["workload"].items() if k not in MEASURED}}
