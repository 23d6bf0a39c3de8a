"""The API process's client of the EngineCore: vLLM 0.33's ``AsyncMPClient`` shape.

After the startup handshake (``vllm.v1.engine.utils``), the API process binds, for
the life of the engine, on the addresses it handed out:

* the **input** channel, a ROUTER on ``ipc:///tmp/<uuid>``: requests go to the
  EngineCore's DEALER as ``[identity, request type, payload]``;
* the **output** channel, a PULL on ``ipc:///tmp/<uuid>``: the EngineCore's PUSH
  sends every answer there.

Both sockets live on a ``zmq.asyncio`` context, so the event loop reads them (pyzmq
registers the socket's FD with ``add_reader``). The EngineCore announces itself on
the input channel with an empty message before the first request, as vLLM's does.
Payloads are pickles (vLLM uses msgspec with a pickle fallback). The EngineCore's
death is seen on its process sentinel (``add_reader``), as vLLM's engine monitor does.
"""

import asyncio
import itertools
import pickle
import time
from typing import Any

import zmq
import zmq.asyncio

from vllm.utils.network_utils import make_zmq_socket

# vLLM's EngineCoreRequestType values the stand-in uses.
REQUEST_ADD = b"\x00"
REQUEST_UTILITY = b"\x03"


class EngineDeadError(RuntimeError):
    """The EngineCore process died or stopped answering."""


class EngineCoreError(RuntimeError):
    """The EngineCore refused or failed a call."""


class AsyncMPClient:
    def __init__(self, proc, addresses, identity: bytes, deadline: float) -> None:
        self._proc = proc
        self._identity = identity
        self._loop = asyncio.get_running_loop()
        self._dead: BaseException | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.ctx = zmq.asyncio.Context()
        self.input_address = addresses.inputs[0]
        self.output_address = addresses.outputs[0]
        self.input_socket = make_zmq_socket(self.ctx, self.input_address, zmq.ROUTER, bind=True)
        self.output_socket = make_zmq_socket(self.ctx, self.output_address, zmq.PULL)
        self._wait_for_registration(deadline)
        self._output_task = self._loop.create_task(self._process_outputs())
        self._loop.add_reader(self._proc.sentinel, self._on_core_exit)

    def _wait_for_registration(self, deadline: float) -> None:
        """The EngineCore's first (empty) message on the input channel."""
        sync_input = zmq.Socket.shadow(self.input_socket.underlying)
        while not sync_input.poll(timeout=200):
            if not self._proc.is_alive():
                raise RuntimeError(
                    f"{self._proc.name} exited with code {self._proc.exitcode} "
                    "before it connected to the input channel"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self._proc.name} sent no initial message on the input channel"
                )
        identity, _ = sync_input.recv_multipart()
        if identity != self._identity:
            raise RuntimeError(f"input channel: unknown engine {identity!r}")

    # -- outputs ---------------------------------------------------------------------
    async def _process_outputs(self) -> None:
        while True:
            try:
                frame = await self.output_socket.recv()
            except zmq.ZMQError:  # the context was destroyed at shutdown
                return
            message = pickle.loads(frame)
            future = self._pending.pop(message[1], None)
            if future is None or future.done():
                continue
            if message[0] == "ok":
                future.set_result(message[2])
            else:
                future.set_exception(EngineCoreError(f"{message[2]}: {message[3]}"))

    def _on_core_exit(self) -> None:
        self._proc.join(0)
        self.mark_dead(
            EngineDeadError(f"{self._proc.name} died (exit code {self._proc.exitcode})")
        )

    def mark_dead(self, error: BaseException) -> None:
        if self._dead is not None:
            return
        self._dead = error
        try:
            self._loop.remove_reader(self._proc.sentinel)
        except Exception:
            pass
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    @property
    def dead(self) -> BaseException | None:
        return self._dead

    # -- inputs ----------------------------------------------------------------------
    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._dead is not None:
            raise self._dead
        call_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[call_id] = future
        request_type = REQUEST_ADD if method == "generate" else REQUEST_UTILITY
        payload = pickle.dumps((call_id, method, args, kwargs))
        await self.input_socket.send_multipart([self._identity, request_type, payload])
        return await future

    def shutdown(self, timeout: float) -> None:
        """Asks the EngineCore to exit, waits, kills it if it does not; closes both
        channels (their socket files stay in /tmp, as libzmq leaves them)."""
        try:
            self._loop.remove_reader(self._proc.sentinel)
        except Exception:
            pass
        self._output_task.cancel()
        if self._proc.is_alive():
            sync_input = zmq.Socket.shadow(self.input_socket.underlying)
            payload = pickle.dumps((0, "shutdown", (), {}))
            try:
                sync_input.send_multipart(
                    [self._identity, REQUEST_UTILITY, payload], flags=zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        self.ctx.destroy(linger=0)
