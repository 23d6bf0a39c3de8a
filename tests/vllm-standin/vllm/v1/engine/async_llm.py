"""AsyncLLM: the engine client in the API process (the object server.py drives).

It spawns the EngineCore (``vllm.v1.engine.core``) through
``multiprocessing.get_context("spawn")`` and talks to it over a spawn-context Pipe,
read from the event loop (``add_reader``), so calls from several requests can be in
flight. The spawn-context Queue the EngineCore reports ready on is held for the life
of the engine; its POSIX named semaphores (``/dev/shm/sem.mp-*``) keep their names,
as multiprocessing leaves them until the Queue is finalized: both processes map each
through the name glibc created it under (now unlinked) while the final name still
links it, which CRIU can dump only with ``link-remap``.
``VSNAP_STANDIN_UNLINK_SEMAPHORES=1`` unlinks the names once the EngineCore opened them
(CRIU then dumps them as ghost files).
"""

import asyncio
import itertools
import multiprocessing
import os
import queue
import time
from collections.abc import AsyncGenerator
from typing import Any

from vllm import envs
from vllm.logger import init_logger
from vllm.logprobs import Logprob
from vllm.model_executor import standin_lm
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams

logger = init_logger("vllm.v1.engine.async_llm")


class EngineDeadError(RuntimeError):
    """The EngineCore process died or stopped answering."""


class EngineCoreError(RuntimeError):
    """The EngineCore refused or failed a call."""


def _unlink_queue_semaphores(q) -> list[str]:
    """Unlinks the named semaphores of a spawn-context Queue (both ends have them open)."""
    from _multiprocessing import sem_unlink
    from multiprocessing import resource_tracker, util
    from multiprocessing.synchronize import SemLock

    names = []
    for lock in (q._rlock, q._wlock, q._sem):
        name = getattr(getattr(lock, "_semlock", None), "name", None)
        if not name:
            continue
        sem_unlink(name)
        resource_tracker.unregister(name, "semaphore")
        # The creator's finalizer would unlink it again at exit.
        for finalizer in list(util._finalizer_registry.values()):
            if finalizer._callback is SemLock._cleanup and finalizer._args == (name,):
                finalizer.cancel()
        names.append(name)
    return names


class AsyncLLM:
    def __init__(self, vllm_config: Any, **kwargs: Any) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self._dead: BaseException | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()

        method = envs.VLLM_WORKER_MULTIPROC_METHOD
        if method != "spawn":
            raise RuntimeError(
                f"VLLM_WORKER_MULTIPROC_METHOD={method!r}: the vsnap stand-in "
                "starts its EngineCore with 'spawn' only"
            )
        context = multiprocessing.get_context("spawn")
        self._status_queue = context.Queue()
        parent_conn, child_conn = context.Pipe(duplex=True)
        core_config = {
            "name": "EngineCore_DP0",
            "weights_dir": self.model_config.weights_dir,
            "kv_cache_mb": vllm_config.kv_cache_mb,
            "max_model_len": self.model_config.max_model_len,
        }
        from vllm.v1.engine.core import run_engine_core

        t0 = time.monotonic()
        self._proc = context.Process(
            target=run_engine_core,
            name="EngineCore_DP0",
            args=(child_conn, self._status_queue, core_config),
            daemon=True,
        )
        self._proc.start()
        child_conn.close()
        self._conn = parent_conn
        deadline = time.monotonic() + envs.VLLM_ENGINE_READY_TIMEOUT_S
        while True:
            try:
                status = self._status_queue.get(timeout=0.2)
                break
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(
                        "Engine core initialization failed: EngineCore_DP0 exited "
                        f"with code {self._proc.exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    self._proc.kill()
                    raise TimeoutError("EngineCore_DP0 did not become ready") from None
        if status[0] != "ready":
            self._proc.join(5)
            raise RuntimeError(
                f"Engine core initialization failed: {status[1]}\n{status[2]}"
            )
        self.core_pid = status[1]["pid"]
        self.semaphores = (
            _unlink_queue_semaphores(self._status_queue)
            if os.environ.get("VSNAP_STANDIN_UNLINK_SEMAPHORES") == "1"
            else []
        )
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        logger.info(
            "EngineCore_DP0 (pid %d) ready in %.3f s", self.core_pid, time.monotonic() - t0
        )

    @classmethod
    def from_vllm_config(cls, vllm_config: Any, **kwargs: Any) -> "AsyncLLM":
        return cls(vllm_config, **kwargs)

    # -- transport -----------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            while self._conn.poll():
                message = self._conn.recv()
                future = self._pending.pop(message[1], None)
                if future is None or future.done():
                    continue
                if message[0] == "ok":
                    future.set_result(message[2])
                else:
                    future.set_exception(EngineCoreError(f"{message[2]}: {message[3]}"))
        except (EOFError, OSError) as error:
            self._mark_dead(EngineDeadError(f"EngineCore_DP0 died: {error!r}"))

    def _mark_dead(self, error: BaseException) -> None:
        if self._dead is not None:
            return
        self._dead = error
        logger.error("%s", error)
        try:
            self._loop.remove_reader(self._conn.fileno())
        except Exception:
            pass
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._dead is not None:
            raise self._dead
        call_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[call_id] = future
        try:
            self._conn.send(("call", call_id, method, args, kwargs))
        except OSError as error:
            self._pending.pop(call_id, None)
            self._mark_dead(EngineDeadError(f"EngineCore_DP0 died: {error!r}"))
            raise self._dead from error
        return await future

    # -- the EngineClient surface server.py and the HTTP frontend use --------------
    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        **kwargs: Any,
    ) -> AsyncGenerator[RequestOutput, None]:
        if isinstance(prompt, str):
            prompt_text, prompt_ids = prompt, standin_lm.tokenize(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            prompt_ids = list(prompt["prompt_token_ids"])
            prompt_text = prompt.get("prompt")
        elif isinstance(prompt, dict) and "prompt" in prompt:
            prompt_text = prompt["prompt"]
            prompt_ids = standin_lm.tokenize(prompt_text)
        else:
            raise TypeError(f"unsupported prompt type {type(prompt).__name__}")
        result = await self._call(
            "generate", request_id, prompt_ids, sampling_params.to_dict()
        )
        token_ids = result["token_ids"]
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = []
            for tid, lp, rank, tops in zip(
                token_ids, result["logprobs"], result["ranks"], result["top_logprobs"]
            ):
                position = {
                    tid: Logprob(lp, rank, standin_lm.decode_token(tid))
                }
                for top_id, top_lp, top_rank in tops:
                    position.setdefault(
                        top_id, Logprob(top_lp, top_rank, standin_lm.decode_token(top_id))
                    )
                logprobs.append(position)
        output = CompletionOutput(
            index=0,
            text=standin_lm.decode(token_ids),
            token_ids=token_ids,
            cumulative_logprob=sum(result["logprobs"]),
            logprobs=logprobs,
            finish_reason=result["finish_reason"],
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=prompt_text,
            prompt_token_ids=prompt_ids,
            prompt_logprobs=None,
            outputs=[output],
            finished=True,
        )

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.model_config.enable_sleep_mode:
            raise ValueError("Sleep mode is not enabled (--enable-sleep-mode)")
        await self._call("sleep", level, mode)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        return await self._call("wake_up", tags)

    async def is_sleeping(self) -> bool:
        return await self._call("is_sleeping")

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
    ):
        call = self._call("collective_rpc", method, tuple(args), kwargs or {})
        if timeout is not None:
            return await asyncio.wait_for(call, timeout)
        return await call

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def reset_mm_cache(self) -> None:
        return None

    async def check_health(self) -> None:
        if self._dead is not None:
            raise self._dead
        await self._call("health")

    async def do_log_stats(self) -> None:
        return None

    @property
    def is_running(self) -> bool:
        return self._dead is None and self._proc.is_alive()

    @property
    def is_stopped(self) -> bool:
        return self._dead is not None

    @property
    def errored(self) -> bool:
        return self._dead is not None or not self._proc.is_alive()

    @property
    def dead_error(self) -> BaseException:
        return self._dead or EngineDeadError("EngineCore_DP0 is not running")

    def shutdown(self, timeout: float | None = None) -> None:
        try:
            self._loop.remove_reader(self._conn.fileno())
        except Exception:
            pass
        if self._proc.is_alive():
            try:
                self._conn.send(("call", 0, "shutdown", (), {}))
            except OSError:
                pass
            self._proc.join(timeout if timeout else 5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        try:
            self._conn.close()
        except OSError:
            pass
        self._status_queue.close()
