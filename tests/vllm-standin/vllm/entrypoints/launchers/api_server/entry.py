"""build_async_engine_client / build_and_serve, with vLLM 0.33.0's signatures."""

import socket
from argparse import Namespace
from collections.abc import AsyncIterator, MutableSequence
from contextlib import asynccontextmanager
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.logger import init_logger

from .. import identity
from ..app import build_app
from ..launcher import serve_http

logger = init_logger("vllm.entrypoints.launchers.api_server.entry")


@asynccontextmanager
async def build_async_engine_client(
    args: Namespace,
    *,
    usage_context: Any = None,
    client_config: dict[str, Any] | None = None,
) -> AsyncIterator[Any]:
    engine_args = AsyncEngineArgs.from_cli_args(args)
    async with build_async_engine_client_from_engine_args(
        engine_args, usage_context=usage_context, client_config=client_config
    ) as engine:
        yield engine


@asynccontextmanager
async def build_async_engine_client_from_engine_args(
    engine_args: AsyncEngineArgs,
    *,
    usage_context: Any = None,
    client_config: dict[str, Any] | None = None,
) -> AsyncIterator[Any]:
    vllm_config = engine_args.create_engine_config(usage_context=usage_context)
    from vllm.v1.engine.async_llm import AsyncLLM

    async_llm = None
    try:
        async_llm = AsyncLLM.from_vllm_config(vllm_config=vllm_config)
        await async_llm.reset_mm_cache()
        yield async_llm
    finally:
        if async_llm:
            async_llm.shutdown(timeout=vllm_config.shutdown_timeout)


async def build_and_serve(
    engine_client: Any,
    listen_address: str,
    sock: socket.socket,
    args: Namespace,
    peer_loads: tuple[MutableSequence[int], int] | None = None,
    **uvicorn_kwargs: Any,
):
    """Build the app and serve; returns the shutdown coroutine for the caller to await.

    Before that, with the released state restored, become this activation's own
    (identity.py): the release file's identity, or identity.json beside it.
    """
    identity.apply_found()
    supported_tasks = await engine_client.get_supported_tasks()
    logger.info("Supported tasks: %s", supported_tasks)
    app = build_app(args, supported_tasks, engine_client)
    logger.info("Starting vLLM server on %s", listen_address)
    return await serve_http(
        app,
        sock=sock,
        host=args.host,
        port=args.port,
        h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count,
        **uvicorn_kwargs,
    )
