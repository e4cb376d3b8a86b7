"""What engine to build: the config's ``engine`` section, typed, with its defaults and its rules (one source:
meshbench.workload.config derives the embedded defaults from these fields, and a test holds the config
schema's keys equal to them)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass

from meshbench.engine import rpc
from meshbench.errors import MeshbenchError

# The flags meshbench gives a server it starts (endpoint.llama_server.serving): not the user's to override.
# (where the model comes from, too: a hub flag would make the server fetch and serve another model)
OWN_SERVER_FLAGS = frozenset(
    {"-m", "--model", "--host", "--port", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
     "-dr", "--docker-repo", "-hft", "--hf-token", "--path", "--api-prefix"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineSpec:
    kind: str = "synthetic"  # synthetic | gguf | endpoint (a serving endpoint as the node under test)
    preset: str = "dgr-012"  # the synthetic model's preset (meshbench.model.config)
    model: str | None = None  # a GGUF file
    seed: int = 0  # the synthetic weights' seed
    device: str = "cpu"
    threads: int | None = None  # llama.cpp's threads (None: its default)
    flash_attn: bool = False
    kv_unified: bool = False
    kv_type: str = "f16"
    make_model: dict | None = None  # {preset, type, seed}: generate ``model`` when it is missing
    rpc: str | None = None  # llama.cpp RPC workers, HOST:PORT[,HOST:PORT...]: the model's layers go there
    workers: int = 0  # spawn this many local RPC workers for the run (loopback, free ports)
    split: tuple[float, ...] | None = None  # share of layers per RPC device (None: llama.cpp's proportional split)
    isolate: bool | None = None  # the engine in its own process (None: exactly when RPC workers are used)
    mixed_batch: bool = False  # GGUF: a tick's decode items and prompt chunks in ONE llama_decode
    repack: bool = False  # GGUF: llama.cpp's CPU weight repacking (use_extra_bufts)
    tiled_mm: str = "auto"  # GGUF: ggml's tiled K-quant matmul, GGML_CPU_TILED_MM (auto | off | force)
    package: str | None = None  # a model a pip package ships (meshbench.engine.packaged)
    url: str | None = None  # endpoint: the server's http://HOST:PORT
    api: str = "auto"  # endpoint: native (llama-server's /completion) | openai (/v1/completions) | auto
    serve: str | None = None  # endpoint: llama-server, started by meshbench on engine.model (or .package)
    server_args: str | None = None  # endpoint: the started server's own flags (its defaults otherwise)
    deadline_s: float = 300.0  # endpoint: one request's deadline, submission to last byte (its session fails then)
    allow_remote: bool = False  # endpoint: a url off this machine (not loopback) is refused unless this is set
    ban_eog: bool = False  # the workload's eos policy is ban: the engine masks end-of-generation tokens

    def __post_init__(self) -> None:
        if self.split is not None:
            object.__setattr__(self, "split", tuple(self.split))
        self._check_kind()
        self._check_process()

    def _check_kind(self) -> None:
        """What needs the gguf engine, and what excludes what."""
        if self.kind == "endpoint":
            return self._check_endpoint()
        if (
            self.url is not None
            or self.api != "auto"
            or self.serve is not None
            or self.server_args is not None
            or self.deadline_s != 300.0
            or self.allow_remote
        ):
            raise MeshbenchError(
                "engine.url, engine.api, engine.serve, engine.server_args, engine.deadline_s and engine.allow_remote "
                "are an endpoint's (engine.kind endpoint: --target, --serve)"
            )
        gguf = self.kind == "gguf"
        if gguf and not self.model and not self.package:
            raise MeshbenchError("engine.kind gguf needs engine.model (a GGUF file path) or engine.package")
        if not gguf and (self.repack or self.tiled_mm != "auto" or self.package):
            raise MeshbenchError("engine.repack, engine.tiled_mm and engine.package need the gguf engine")
        if self.mixed_batch and not gguf:
            raise MeshbenchError(
                "engine.mixed_batch needs the gguf engine (one llama_decode per tick); the "
                "synthetic engine always runs its batched decode and each prompt in one call"
            )
        if (self.rpc or self.workers) and not gguf:
            raise MeshbenchError("engine.rpc and engine.workers need the gguf engine (llama.cpp RPC)")

    def _check_endpoint(self) -> None:
        """A served model: its URL, or llama-server started on our model file; nothing that builds an engine of
        meshbench's own."""
        if bool(self.url) == bool(self.serve):
            raise MeshbenchError(
                "engine.kind endpoint needs engine.url (--target http://HOST:PORT) or engine.serve "
                "(--serve llama-server), one of them"
            )
        if self.serve and not (self.model or self.package):
            raise MeshbenchError("engine.serve needs the model to serve: engine.model or engine.package")
        if self.server_args is not None and not self.serve:
            raise MeshbenchError("engine.server_args are for a server meshbench starts (engine.serve)")
        # llama.cpp reads --a_b as --a-b, and --flag=value as --flag value
        flags = {a.split("=", 1)[0].replace("_", "-") if a.startswith("--") else a for a in self.server_argv}
        taken = sorted(flags & OWN_SERVER_FLAGS)
        if taken:
            raise MeshbenchError(
                f"engine.server_args {taken[0]}: meshbench sets the server's model, host (loopback) and port itself"
            )
        if not (isinstance(self.deadline_s, (int, float)) and 0 < self.deadline_s <= 86400):
            raise MeshbenchError(f"engine.deadline_s {self.deadline_s!r}: give seconds, above 0 and at most 86400")
        ours = {
            "rpc": self.rpc,
            "workers": self.workers,
            "mixed_batch": self.mixed_batch,
            "repack": self.repack,
            "tiled_mm": self.tiled_mm != "auto",
            "threads": self.threads is not None,
            "isolate": self.isolate is not None,
            "device": self.device != "cpu",
            "preset": self.preset != "dgr-012",
            "flash_attn": self.flash_attn,
            "kv_unified": self.kv_unified,
            "kv_type": self.kv_type != "f16",
            "split": self.split is not None,
            "make_model": self.make_model is not None,
        }
        if not self.serve:
            ours.update(model=self.model, package=self.package)
        given = [k for k, v in ours.items() if v]
        if given:
            raise MeshbenchError(
                f"engine.{given[0]} builds an engine of meshbench's own; an endpoint (--target) is the server's"
            )

    def _check_process(self) -> None:
        """What must run the engine in its own process, and the RPC workers' layout."""
        if self.tiled_mm != "auto" and self.isolate is False:
            raise MeshbenchError(
                f"engine.tiled_mm {self.tiled_mm} is a process-wide llama.cpp switch: it needs the "
                "engine in its own process (drop isolate: false)"
            )
        if (self.rpc or self.workers) and self.isolate is False:
            raise MeshbenchError(
                "engine.rpc and engine.workers run the engine in its own process (a worker that "
                "misbehaves can abort or hang llama.cpp): drop isolate false / --no-isolate"
            )
        if self.rpc and self.workers:
            raise MeshbenchError("give engine.rpc (workers you run) or engine.workers (spawned), not both")
        devices = len(rpc.parse_endpoints(self.rpc, "engine.rpc")) if self.rpc else self.workers
        if self.split is not None and len(self.split) != devices:
            raise MeshbenchError(f"engine.split has {len(self.split)} shares for {devices} RPC workers")

    @property
    def server_argv(self) -> list[str]:
        """The started server's own flags, split as a shell would (a MeshbenchError for an unterminated quote)."""
        try:
            return shlex.split(self.server_args or "")
        except ValueError as e:
            raise MeshbenchError(f"engine.server_args {self.server_args!r}: {e}") from None

    @property
    def isolated(self) -> bool:
        """In its own process: as configured, else exactly when RPC workers are used or a process-wide
        llama.cpp switch (tiled_mm) is set, which must never leak into the node's own process."""
        if self.isolate is not None:
            return self.isolate
        return bool(self.rpc or self.workers or self.tiled_mm != "auto")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["split"] = None if self.split is None else list(self.split)
        del d["ban_eog"]  # derived from workload.eos, echoed there
        if self.package:
            d["model"] = None  # the package names it; its file is assembled into the cache at run time
        return d
