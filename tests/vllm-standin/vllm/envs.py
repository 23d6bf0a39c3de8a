"""The few VLLM_* environment variables the stand-in reads (lazily, like vllm.envs)."""

import os
import tempfile
from typing import Any


def _bool(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes")


environment_variables = {
    "VLLM_API_KEY": lambda: os.environ.get("VLLM_API_KEY", None),
    "VLLM_WORKER_MULTIPROC_METHOD": lambda: os.environ.get(
        "VLLM_WORKER_MULTIPROC_METHOD", "spawn"
    ),
    "VLLM_ENGINE_READY_TIMEOUT_S": lambda: int(
        os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600")
    ),
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": lambda: int(
        os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5")
    ),
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": lambda: _bool("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"),
    "VLLM_LOGGING_LEVEL": lambda: os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(),
    "VLLM_CONFIGURE_LOGGING": lambda: _bool("VLLM_CONFIGURE_LOGGING", "1"),
    # Where the ZMQ ipc:// sockets between the API process and the EngineCore are
    # made (vllm.utils.network_utils.get_open_zmq_ipc_path): /tmp by default.
    "VLLM_RPC_BASE_PATH": lambda: os.environ.get(
        "VLLM_RPC_BASE_PATH", tempfile.gettempdir()
    ),
}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return list(environment_variables.keys())
