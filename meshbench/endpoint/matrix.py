"""A matrix of server settings (``engine.server_settings``): the server ``engine.serve`` names started once per
setting, with the matrix's flags and then the setting's, and swept alike (meshbench.endpoint.sweep). Every
setting is first tried (the server started and stopped) so that a flag the server refuses is said in one line
before any sweep runs, not after an hour of the others."""

from __future__ import annotations

from typing import Callable, Iterator

from meshbench.endpoint import sweep as endpoint_sweep
from meshbench.errors import MeshbenchError
from meshbench.records import serial
from meshbench.records.context import Environment
from meshbench.workload import matrix
from meshbench.workload.config import RunConfig
from meshbench.workload.matrix_config import setting_config


def run(
    cfg: RunConfig, command: str, environment: Environment, progress: Callable[[str], None] = lambda m: None
) -> Iterator[tuple[str, dict]]:
    """Each setting's flags and its sweep's results.json, in the order given, as each sweep ends (so a caller
    keeps the finished ones when a later one fails)."""
    flags = list(cfg.engine.server_settings or ())
    configs = [setting_config(cfg, f) for f in flags]
    commands = [matrix.sub_command(command, cfg.engine.server_args, f) for f in flags]
    launcher, server, model = endpoint_sweep.served(cfg)
    for f, sub in zip(flags, configs):
        progress(f"setting {matrix.folder(f)}: does {launcher.name} start with {sub.engine.server_args or 'no flags'}?")
        try:
            with launcher.serving(server, model, sub.engine.server_argv):
                pass
        except MeshbenchError as e:
            raise MeshbenchError(f"engine.server_settings {f!r}: {e}") from None
    for k, (f, sub, sub_command) in enumerate(zip(flags, configs, commands)):
        progress(f"setting {k + 1} of {len(flags)}: {matrix.folder(f)} ({sub.engine.server_args or 'no flags'})")
        yield f, serial.to_json(endpoint_sweep.run(sub, sub_command, environment, progress))  # (written to files)
