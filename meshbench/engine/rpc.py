"""llama.cpp's RPC backend (ggml-rpc): remote CPU devices for a model's layers, and the server side.

A worker is llama.cpp's own RPC server (``ggml_backend_rpc_start_server``) serving its
machine's CPU device; a client adds each worker with ``ggml_backend_rpc_add_server`` and
hands its devices to ``llama_model_params.devices``. ggml-rpc is unauthenticated: workers
listen on loopback unless told otherwise. A worker that is unreachable is refused here,
with a timeout, before llama.cpp (which aborts the process on a lost worker) sees it.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from meshbench.errors import MeshbenchError

REBUILD = (
    'pip cache remove llama_cpp_python && CMAKE_ARGS="-DGGML_RPC=on -DLLAVA_BUILD=off" '
    "pip install --force-reinstall --no-deps 'llama-cpp-python~=0.3.36'"
)
GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU = 0, 1, 2
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_endpoints(spec: str, where: str = "--rpc") -> list[Endpoint]:
    """``HOST:PORT[,HOST:PORT...]`` (at most 16, llama.cpp's GGML_RPC_MAX_SERVERS)."""
    out = []
    for part in spec.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise MeshbenchError(f"{where}: {part.strip()!r} is not HOST:PORT (a port from 1 to 65535)")
        if any(c.isspace() for c in host):
            raise MeshbenchError(f"{where}: {host!r} is not a host name")
        out.append(Endpoint(host.strip("[]"), int(port)))
    if not 1 <= len(out) <= 16:
        raise MeshbenchError(f"{where}: give 1 to 16 workers")
    if len(set(out)) != len(out):
        raise MeshbenchError(f"{where}: a worker is named twice")
    return out


# ggml-rpc's wire format (ggml-rpc.cpp in the llama.cpp that llama-cpp-python 0.3.36 vendors): a
# command byte, a little-endian u64 size and the payload; HELLO (14) carries 24 bytes of connection
# capabilities (zeros: none) and is answered with a u64 size and major, minor, patch, pad, 24 bytes.
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24


def hello(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Connect with a timeout and exchange ggml-rpc's HELLO: the worker's protocol version ("7.0.0").

    A port nobody listens on, or something that is not a llama.cpp RPC server, is an input error
    here, before llama.cpp (which aborts the process on a bad worker) connects.
    """
    request = bytes([RPC_CMD_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as s:
            s.sendall(request)
            head = _recv_exact(s, 8)
            size = struct.unpack("<Q", head)[0]
            if size != 4 + RPC_CONN_CAPS_SIZE:
                raise MeshbenchError(
                    f"rpc worker {endpoint}: not a llama.cpp RPC server of a known protocol "
                    f"(HELLO answered with {size} bytes)"
                )
            major, minor, patch = _recv_exact(s, size)[:3]
    except OSError as e:
        raise MeshbenchError(f"rpc worker {endpoint}: cannot connect ({e.strerror or e})") from None
    return f"{major}.{minor}.{patch}"


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(errno.ECONNRESET, "closed before answering HELLO")
        data += chunk
    return data


def check_reachable(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """The worker answers HELLO within ``timeout``; returns its protocol version."""
    return hello(endpoint, timeout)


def _lib_dir() -> Path:
    import llama_cpp  # noqa: PLC0415 - optional extra

    return Path(llama_cpp.__file__).parent / "lib"


def ggml_lib() -> ctypes.CDLL:
    """libggml of the installed llama-cpp-python, with the device calls meshbench uses declared."""
    ggml = ctypes.CDLL(str(_lib_dir() / "libggml.so"))
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
    return ggml


def has_gpu_device() -> bool:
    """Does this llama.cpp see a GPU (dedicated or integrated)? RPC devices are not counted."""
    ggml = ggml_lib()
    return any(ggml.ggml_backend_dev_by_type(t) for t in (GGML_BACKEND_DEVICE_TYPE_GPU, GGML_BACKEND_DEVICE_TYPE_IGPU))


def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(libggml, libggml-rpc), or a MeshbenchError that says how to get an RPC-capable build."""
    try:
        import llama_cpp  # noqa: PLC0415 - optional extra

        supported = bool(llama_cpp.llama_supports_rpc())
    except Exception as e:  # not installed, or its native library failed to load
        raise MeshbenchError(
            f"llama-cpp-python is not usable here ({type(e).__name__}); pip install 'meshbench[gguf]'"
        ) from None
    path = _lib_dir() / "libggml-rpc.so"
    if not supported or not path.is_file():
        raise MeshbenchError(f"this llama-cpp-python was built without RPC; rebuild it with: {REBUILD}")
    ggml = ggml_lib()
    rpc = ctypes.CDLL(str(path))
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ]
    rpc.ggml_backend_rpc_start_server.restype = None
    return ggml, rpc


def devices(endpoints: list[Endpoint]) -> tuple[ctypes.Array, list[str], dict[str, str]]:
    """A NULL-terminated array of the workers' devices (for llama_model_params.devices), their names,
    and each worker's RPC protocol version."""
    ggml, rpc = libraries()
    found, names, versions = [], [], {}
    for ep in endpoints:
        versions[str(ep)] = check_reachable(ep)  # llama.cpp would abort on a worker that is not there
        reg = rpc.ggml_backend_rpc_add_server(str(ep).encode())
        if not reg:
            raise MeshbenchError(f"rpc worker {ep}: llama.cpp could not add it")
        for i in range(ggml.ggml_backend_reg_dev_count(reg)):
            dev = ggml.ggml_backend_reg_dev_get(reg, i)
            found.append(dev)
            names.append(ggml.ggml_backend_dev_name(dev).decode())
    array = (ctypes.c_void_p * (len(found) + 1))(*found, None)
    return array, names, versions


def serve(endpoint: Endpoint, threads: int, cache_dir: str | None) -> None:
    """Serve this machine's CPU device to RPC clients; returns only if the server stops."""
    ggml, rpc = libraries()
    cpu = ggml.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    devs = (ctypes.c_void_p * 1)(cpu)
    rpc.ggml_backend_rpc_start_server(
        str(endpoint).encode(), cache_dir.encode() if cache_dir else None, threads, 1, devs
    )
