"""AsyncLLM: the engine client in the API process (the object server.py drives).

It spawns the EngineCore (``vllm.v1.engine.core``) through
``multiprocessing.get_context("spawn")``, runs vLLM V1's startup handshake with it over
a ZMQ ``ipc://`` socket in /tmp (``vllm.v1.engine.utils``), then talks to it over two
more, the input and output channels, read from the event loop
(``vllm.v1.engine.core_client``), so calls from several requests can be in flight.
The spawn-context Queue the EngineCore reports ready (or its start-up failure) on is
held for the life of the engine; its POSIX named semaphores (``/dev/shm/sem.mp-*``) keep their names,
as multiprocessing leaves them until the Queue is finalized: both processes map each
through the name glibc created it under (now unlinked) while the final name still
links it, which CRIU can dump only with ``link-remap``.
``VSNAP_STANDIN_UNLINK_SEMAPHORES=1`` unlinks the names once the EngineCore opened them
(CRIU then dumps them as ghost files).
"""

import asyncio
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
from vllm.v1.engine.core_client import (  # noqa: F401 (re-exported)
    AsyncMPClient,
    EngineCoreError,
    EngineDeadError,
)
from vllm.v1.engine.utils import ENGINE_IDENTITY, launch_core_engine

logger = init_logger("vllm.v1.engine.async_llm")


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

        method = envs.VLLM_WORKER_MULTIPROC_METHOD
        if method != "spawn":
            raise RuntimeError(
                f"VLLM_WORKER_MULTIPROC_METHOD={method!r}: the vsnap stand-in "
                "starts its EngineCore with 'spawn' only"
            )
        context = multiprocessing.get_context("spawn")
        self._status_queue = context.Queue()
        core_config = {
            "name": "EngineCore_DP0",
            "weights_dir": self.model_config.weights_dir,
            "kv_cache_mb": vllm_config.kv_cache_mb,
            "max_model_len": self.model_config.max_model_len,
        }
        from vllm.v1.engine.core import run_engine_core

        t0 = time.monotonic()
        deadline = t0 + envs.VLLM_ENGINE_READY_TIMEOUT_S
        self._proc, addresses, _ = launch_core_engine(
            context, run_engine_core, core_config, self._status_queue, deadline
        )
        status = self._ready_status(deadline)
        self.core_pid = status["pid"]
        self.semaphores = (
            _unlink_queue_semaphores(self._status_queue)
            if os.environ.get("VSNAP_STANDIN_UNLINK_SEMAPHORES") == "1"
            else []
        )
        self.engine_core = AsyncMPClient(self._proc, addresses, ENGINE_IDENTITY, deadline)
        logger.info(
            "EngineCore_DP0 (pid %d) ready in %.3f s; ZMQ input %s, output %s",
            self.core_pid,
            time.monotonic() - t0,
            addresses.inputs[0],
            addresses.outputs[0],
        )

    def _ready_status(self, deadline: float) -> dict:
        """The EngineCore's ready report on the status Queue (it follows READY)."""
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
        return status[1]

    @classmethod
    def from_vllm_config(cls, vllm_config: Any, **kwargs: Any) -> "AsyncLLM":
        return cls(vllm_config, **kwargs)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.engine_core.call(method, *args, **kwargs)

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
        if self.engine_core.dead is not None:
            raise self.engine_core.dead
        await self._call("health")

    async def do_log_stats(self) -> None:
        return None

    @property
    def is_running(self) -> bool:
        return self.engine_core.dead is None and self._proc.is_alive()

    @property
    def is_stopped(self) -> bool:
        return self.engine_core.dead is not None

    @property
    def errored(self) -> bool:
        return self.engine_core.dead is not None or not self._proc.is_alive()

    @property
    def dead_error(self) -> BaseException:
        return self.engine_core.dead or EngineDeadError("EngineCore_DP0 is not running")

    def shutdown(self, timeout: float | None = None) -> None:
        self.engine_core.shutdown(timeout if timeout else 5)
        self._status_queue.close()
