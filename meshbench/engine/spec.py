"""What engine to build: the settings an engine kind reads (the config's ``engine`` section, typed)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class EngineSpec:
    kind: str
    preset: str
    model: str | None
    seed: int
    device: str
    threads: int | None
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
    ban_eog: bool = False  # the workload's eos policy is ban: the engine masks end-of-generation tokens

    def __post_init__(self) -> None:
        if self.split is not None:
            object.__setattr__(self, "split", tuple(self.split))

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
