"""Starting the EngineCore and its startup handshake (the API process's side).

The shape of vLLM 0.33's ``launch_core_engines`` / ``wait_for_engine_startup``
(vllm/v1/engine/utils.py), for one local engine:

1. The API process names three ``ipc://`` endpoints with ``get_open_zmq_ipc_path()``
   (``/tmp/<uuid4>``): the handshake, the input channel, the output channel.
2. It binds a ROUTER on the handshake endpoint and spawns ``EngineCore_DP0``, which
   connects a DEALER to it (identity: the engine index, 2 bytes little-endian) and
   says ``HELLO``.
3. The API process answers with the input and output addresses.
4. The EngineCore loads its model and says ``READY``; both sides close the handshake
   sockets (each on a ZMQ context of its own, destroyed with it). libzmq leaves the
   handshake's socket file in /tmp: a stale file nothing holds.

vLLM encodes the handshake with msgpack; the stand-in uses JSON (no msgspec here).
The stand-in's EngineCore also reports a start-up failure, with its traceback, on the
spawn-context status Queue before it exits.
"""

import json
import queue
import time
from dataclasses import dataclass

import zmq

from vllm.utils.network_utils import get_open_zmq_ipc_path, make_zmq_socket

# The 2-byte identity of engine 0 on the handshake and the input channel.
ENGINE_IDENTITY = (0).to_bytes(2, "little")


@dataclass
class EngineZmqAddresses:
    inputs: list[str]
    outputs: list[str]


def new_addresses() -> EngineZmqAddresses:
    return EngineZmqAddresses(
        inputs=[get_open_zmq_ipc_path()], outputs=[get_open_zmq_ipc_path()]
    )


def launch_core_engine(context, target, core_config: dict, status_queue, deadline: float):
    """Spawns the EngineCore and runs the handshake; returns (process, addresses, ready).

    ``ready`` is the EngineCore's READY message. On failure the process is gone (or
    killed) and the error says why.
    """
    addresses = new_addresses()
    handshake_address = get_open_zmq_ipc_path()
    ctx = zmq.Context()
    try:
        handshake = make_zmq_socket(ctx, handshake_address, zmq.ROUTER, bind=True)
        proc = context.Process(
            target=target,
            name=core_config["name"],
            kwargs={
                "status_queue": status_queue,
                "config": core_config,
                "handshake_address": handshake_address,
            },
            daemon=True,
        )
        proc.start()
        ready = wait_for_engine_startup(handshake, addresses, proc, status_queue, deadline)
    finally:
        # The handshake is over (or failed): its socket file stays in /tmp.
        ctx.destroy(linger=0)
    return proc, addresses, ready


def _startup_failure(proc, status_queue) -> BaseException:
    """Why the EngineCore exited during start-up: its report on the status Queue."""
    try:
        status = status_queue.get(timeout=5)
    except queue.Empty:
        status = None
    if status and status[0] == "failed":
        return RuntimeError(f"Engine core initialization failed: {status[1]}\n{status[2]}")
    proc.join(5)
    return RuntimeError(
        f"Engine core initialization failed: {proc.name} exited with code {proc.exitcode}"
    )


def wait_for_engine_startup(
    handshake: zmq.Socket,
    addresses: EngineZmqAddresses,
    proc,
    status_queue,
    deadline: float,
) -> dict:
    """HELLO -> the addresses -> READY on the handshake ROUTER; returns READY."""
    poller = zmq.Poller()
    poller.register(handshake, zmq.POLLIN)
    poller.register(proc.sentinel, zmq.POLLIN)
    said_hello = False
    while True:
        events = dict(poller.poll(200))
        if handshake in events:
            identity, raw = handshake.recv_multipart()
            message = json.loads(raw)
            status = message.get("status")
            if identity != ENGINE_IDENTITY:
                raise RuntimeError(f"handshake from an unknown engine {identity!r}")
            if status == "HELLO" and not said_hello:
                init = {"addresses": {"inputs": addresses.inputs, "outputs": addresses.outputs}}
                handshake.send_multipart([identity, json.dumps(init).encode()])
                said_hello = True
                continue
            if status == "READY" and said_hello:
                return message
            raise RuntimeError(f"unexpected handshake message from the engine: {message}")
        if proc.sentinel in events or not proc.is_alive():
            raise _startup_failure(proc, status_queue)
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{proc.name} did not become ready")
