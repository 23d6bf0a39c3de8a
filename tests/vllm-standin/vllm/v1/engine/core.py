"""The stand-in EngineCore: the process that holds the model and computes answers.

Started by ``AsyncLLM`` through ``multiprocessing.get_context("spawn")`` as
``EngineCore_DP0``. It

* loads the Triton-like launcher: copies the compiled ``cuda_utils.so`` into
  ``$TRITON_CACHE_DIR`` (default ``~/.triton/cache``) under ``<sha256 hex>/`` and keeps
  it loaded with ``ctypes.CDLL`` (so mapped) for the life of the process;
* reads the weights (``<model>/weights.bin``) into anonymous memory ("device memory"),
  writing progress lines to stderr, and allocates a KV cache;
* runs vLLM V1's startup handshake with the API process over ZMQ (a DEALER on the
  handshake ``ipc://`` endpoint: HELLO, the input and output addresses back, the model
  loaded, READY; then that socket is closed), and reports ready (or its failure)
  over the spawn-context Queue it was given;
* serves calls from the API process as vLLM's EngineCoreProc does: an input thread
  reads them from a DEALER connected to the API process's input ROUTER, the main
  thread runs them one at a time (generate, sleep, wake_up,
  collective_rpc("reload_weights"), ...), an output thread PUSHes the answers to the
  API process's output PULL. Both are ``ipc:///tmp/<uuid>`` endpoints.

Memory states follow vLLM's sleep mode: level 1 offloads the weights to host memory
and discards the KV cache; level 2 discards both, so waking the weights gives
uninitialized (zeroed) memory until ``reload_weights`` reads them from disk again.
Generating while any part is asleep is an error.
"""

import ctypes
import hashlib
import json
import mmap
import multiprocessing
import os
import pickle
import queue
import sys
import threading
import time
import traceback
import uuid

import zmq

from vllm.logger import init_logger, set_process_prefix
from vllm.model_executor import standin_lm
from vllm.utils.network_utils import make_zmq_socket
from vllm.v1.engine.utils import ENGINE_IDENTITY

logger = init_logger("vllm.v1.engine.core")

LAUNCHER_SOURCE_DEFAULT = "/opt/standin/cuda_utils.so.bin"
LAUNCHER_SYMBOL = "vsnap_launcher_ok"
LAUNCHER_MAGIC = 42
_MiB = 1 << 20
HANDSHAKE_TIMEOUT_MS = 600_000

# Kept for the life of the process, like Triton's compiled launchers.
_LOADED_LAUNCHERS: list = []


def triton_cache_dir() -> str:
    configured = os.environ.get("TRITON_CACHE_DIR")
    if configured:
        return configured
    home = os.path.expanduser("~")
    if home == "~" or not home:
        raise RuntimeError("cannot find a home folder for ~/.triton/cache (set HOME)")
    return os.path.join(home, ".triton", "cache")


def load_launcher() -> str:
    """Puts cuda_utils.so in the Triton cache (reusing an entry) and dlopens it."""
    source = os.environ.get("VSNAP_STANDIN_LAUNCHER_SO", LAUNCHER_SOURCE_DEFAULT)
    with open(source, "rb") as f:
        data = f.read()
    key = hashlib.sha256(data).hexdigest()
    folder = os.path.join(triton_cache_dir(), key)
    path = os.path.join(folder, "cuda_utils.so")
    if os.path.exists(path):
        logger.info("Triton cache hit: %s", path)
    else:
        os.makedirs(folder, exist_ok=True)
        temporary = f"{path}.tmp.pid_{os.getpid()}_{uuid.uuid4().hex}"
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        logger.info("Triton cache miss: compiled launcher written to %s", path)
    library = ctypes.CDLL(path)
    function = getattr(library, LAUNCHER_SYMBOL)
    function.restype = ctypes.c_int
    function.argtypes = []
    value = function()
    if value != LAUNCHER_MAGIC:
        raise RuntimeError(f"{path}: {LAUNCHER_SYMBOL}() returned {value}")
    _LOADED_LAUNCHERS.append(library)
    return path


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class EngineCore:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.model_dir = config["weights_dir"]
        self.weights_path = os.path.join(self.model_dir, "weights.bin")
        self.kv_bytes = int(config["kv_cache_mb"]) * _MiB
        self.weights: mmap.mmap | None = None
        self.weights_offloaded: bytes | None = None
        self.weights_size = 0
        self.digest: bytes | None = None
        self.kv_cache: mmap.mmap | None = None
        self.sleep_level = 0
        self.launcher_path = load_launcher()
        t0 = time.monotonic()
        self._read_weights(allocate=True)
        logger.info(
            "Model loading took %.4f GiB memory and %.6f seconds",
            self.weights_size / (1 << 30),
            time.monotonic() - t0,
        )
        self._allocate_kv_cache()
        logger.info(
            "KV cache: %d MiB; weights sha256 %s", self.kv_bytes // _MiB, self.digest.hex()
        )

    # -- memory ---------------------------------------------------------------------
    def _read_weights(self, *, allocate: bool) -> None:
        size = os.stat(self.weights_path).st_size
        if size <= 0:
            raise RuntimeError(f"{self.weights_path} is empty")
        if allocate:
            self.weights = mmap.mmap(-1, size)
            self.weights_size = size
        elif self.weights is None:
            raise RuntimeError("reload_weights: the weights are asleep (wake them first)")
        elif size != self.weights_size:
            raise RuntimeError(
                f"reload_weights: {self.weights_path} has {size} bytes, "
                f"the model was built with {self.weights_size}"
            )
        view = memoryview(self.weights)
        chunks = 4
        step = max(1, -(-size // chunks))
        done = 0
        t0 = time.monotonic()
        with open(self.weights_path, "rb", buffering=0) as f:
            index = 0
            while done < size:
                want = min(step, size - done)
                got = f.readinto(view[done : done + want])
                if not got:
                    raise RuntimeError(f"{self.weights_path}: short read at {done}")
                done += got
                index += 1
                _progress(
                    f"Loading weights.bin shards: {100 * done // size:3d}% Completed | "
                    f"{index}/{chunks} [{time.monotonic() - t0:.2f}s]"
                )
        view.release()
        self.digest = standin_lm.weights_digest(self.weights)

    def _allocate_kv_cache(self) -> None:
        kv = mmap.mmap(-1, self.kv_bytes)
        page = mmap.PAGESIZE
        for offset in range(0, self.kv_bytes, page):
            kv[offset] = 1  # touch: the memory is really there
        self.kv_cache = kv

    def _free_weights(self) -> None:
        if self.weights is not None:
            self.weights.close()
            self.weights = None

    def _free_kv_cache(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.close()
            self.kv_cache = None

    # -- calls from the API process ------------------------------------------------
    def rpc_generate(self, request_id: str, prompt_token_ids: list[int], params: dict):
        if self.weights is None or self.kv_cache is None:
            raise RuntimeError(f"request {request_id}: the engine is sleeping")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        max_model_len = self.config.get("max_model_len") or 0
        max_tokens = params.get("max_tokens") or 16
        if max_model_len and len(prompt_token_ids) + max_tokens > max_model_len:
            raise ValueError(
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, you requested {max_tokens} output tokens and your prompt "
                f"contains {len(prompt_token_ids)} input tokens."
            )
        return standin_lm.generate(self.digest, prompt_token_ids, params)

    def rpc_sleep(self, level: int = 1, mode: str = "abort") -> None:
        t0 = time.monotonic()
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        freed = 0
        if self.weights is not None:
            if level == 1:
                self.weights_offloaded = bytes(self.weights)
            else:
                self.weights_offloaded = None
            freed += self.weights_size
            self._free_weights()
        if self.kv_cache is not None:
            freed += self.kv_bytes
            self._free_kv_cache()
        self.sleep_level = max(self.sleep_level, level)
        logger.info(
            "It took %.6f seconds to fall asleep (level %d); freed %.4f GiB",
            time.monotonic() - t0,
            level,
            freed / (1 << 30),
        )

    def rpc_wake_up(self, tags: list[str] | None = None) -> bool:
        t0 = time.monotonic()
        tags = ["weights", "kv_cache"] if tags is None else list(tags)
        for tag in tags:
            if tag not in ("weights", "kv_cache"):
                raise ValueError(f"unknown wake_up tag {tag!r}")
        if "weights" in tags and self.weights is None:
            self.weights = mmap.mmap(-1, self.weights_size)
            if self.weights_offloaded is not None:
                self.weights[:] = self.weights_offloaded
                self.weights_offloaded = None
            # Level 2: uninitialized until reload_weights.
            self.digest = standin_lm.weights_digest(self.weights)
        if "kv_cache" in tags and self.kv_cache is None:
            self._allocate_kv_cache()
        awake = self.weights is not None and self.kv_cache is not None
        if awake:
            self.sleep_level = 0
        logger.info(
            "It took %.6f seconds to wake up tags %s", time.monotonic() - t0, tags
        )
        return awake

    def rpc_is_sleeping(self) -> bool:
        return self.weights is None or self.kv_cache is None

    def rpc_collective_rpc(self, method: str, args=(), kwargs=None):
        function = getattr(self, f"worker_{method}", None)
        if function is None:
            raise AttributeError(f"Worker has no method {method!r}")
        return [function(*args, **(kwargs or {}))]

    def rpc_health(self) -> str:
        return "ok"

    # -- worker methods (collective_rpc) -------------------------------------------
    def worker_reload_weights(self) -> None:
        t0 = time.monotonic()
        self._read_weights(allocate=False)
        logger.info(
            "Reloading weights took %.6f seconds; weights sha256 %s",
            time.monotonic() - t0,
            self.digest.hex(),
        )

    def worker_weights_sha256(self) -> str | None:
        return None if self.weights is None else self.digest.hex()

    def worker_triton_launcher(self) -> str:
        return self.launcher_path

    def worker_pid(self) -> int:
        return os.getpid()


def _startup_handshake(address: str, status: dict, work):
    """vLLM's ``_perform_handshakes``: HELLO, the addresses back, ``work()``, READY.

    The handshake DEALER lives on a ZMQ context of its own, destroyed (with a linger
    that lets READY go out) once READY is sent; returns (addresses, work's result).
    """
    ctx = zmq.Context()
    try:
        sock = make_zmq_socket(
            ctx, address, zmq.DEALER, bind=False, identity=ENGINE_IDENTITY, linger=5000
        )
        sock.send(json.dumps({"status": "HELLO", "local": True, "headless": False}).encode())
        if not sock.poll(timeout=HANDSHAKE_TIMEOUT_MS):
            raise TimeoutError(f"no answer on the handshake socket {address}")
        addresses = json.loads(sock.recv())["addresses"]
        result = work()
        sock.send(json.dumps(dict(status, status="READY", local=True)).encode())
        return addresses, result
    finally:
        ctx.destroy(linger=5000)


def _process_input_socket(ctx, address: str, input_queue: queue.Queue) -> None:
    """The input thread: requests from the API process's ROUTER, onto the queue.

    It also watches the parent's sentinel: the API process gone, the EngineCore exits.
    """
    sock = make_zmq_socket(ctx, address, zmq.DEALER, bind=False, identity=ENGINE_IDENTITY)
    # Tells the frontend's ROUTER this engine's identity before any request.
    sock.send(b"")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        poller.register(parent.sentinel, zmq.POLLIN)
    while True:
        for what, _ in poller.poll():
            if what is sock:
                _request_type, payload = sock.recv_multipart()
                input_queue.put(pickle.loads(payload))
            else:  # the API process is gone: nothing left to serve
                os._exit(0)


def _process_output_socket(ctx, address: str, output_queue: queue.Queue) -> None:
    """The output thread: answers from the queue, PUSHed to the API process."""
    sock = make_zmq_socket(ctx, address, zmq.PUSH, linger=4000)
    while True:
        sock.send(pickle.dumps(output_queue.get()))


def _serve(core: EngineCore, addresses: dict) -> None:
    """vLLM's busy loop: one call at a time, between the input and output threads."""
    ctx = zmq.Context()
    input_queue: queue.Queue = queue.Queue()
    output_queue: queue.Queue = queue.Queue()
    for target, address, q in (
        (_process_input_socket, addresses["inputs"][0], input_queue),
        (_process_output_socket, addresses["outputs"][0], output_queue),
    ):
        threading.Thread(target=target, args=(ctx, address, q), daemon=True).start()
    while True:
        call_id, method, args, kwargs = input_queue.get()
        if method == "shutdown":
            os._exit(0)
        try:
            result = getattr(core, f"rpc_{method}")(*args, **kwargs)
            reply = ("ok", call_id, result)
        except Exception as error:
            reply = ("err", call_id, type(error).__name__, str(error))
        output_queue.put(reply)


def run_engine_core(status_queue, config: dict, handshake_address: str) -> None:
    """Entry point of the spawned EngineCore process."""
    set_process_prefix(f"({config.get('name', 'EngineCore')} pid={os.getpid()}) ")
    try:
        addresses, core = _startup_handshake(
            handshake_address, {"num_gpu_blocks": 0}, lambda: EngineCore(config)
        )
    except BaseException as error:  # reported to the API process, then exit
        status_queue.put(
            ("failed", f"{type(error).__name__}: {error}", traceback.format_exc())
        )
        status_queue.close()
        status_queue.join_thread()
        sys.exit(1)
    status_queue.put(("ready", {"pid": os.getpid(), "launcher": core.launcher_path}))
    _serve(core, addresses)
