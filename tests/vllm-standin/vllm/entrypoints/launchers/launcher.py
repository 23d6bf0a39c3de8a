"""setup_server (bind the listening socket) and serve_http, as vLLM's launcher.

``setup_server(args, reuse_port=...)`` binds ``(args.host or "", args.port)``
(``SO_REUSEADDR``; IPv6 when the host is an IPv6 address; ``args.uds`` for a Unix
socket) without listening, and returns ``(listen_address, sock)``.

``serve_http(app, sock, ...)`` listens on that socket with asyncio and serves until
shut down, then returns a coroutine for the caller to await (vLLM's contract).

Signals: vLLM's serve_http registers SIGINT and SIGTERM handlers on the event loop
for a graceful shutdown. The stand-in installs none by default, so the process keeps
the default SIGTERM disposition (as PID 1 of a pid namespace the kernel then ignores
SIGTERM); ``VSNAP_STANDIN_SERVE_SIGNALS=1`` installs vLLM's handlers.
"""

import asyncio
import ipaddress
import os
import resource
import signal
import socket
from typing import Any

from vllm import envs
from vllm.entrypoints.common.cli_args import validate_api_server_args
from vllm.logger import init_logger
from vllm.version import __version__ as VLLM_VERSION

logger = init_logger("vllm.entrypoints.launchers.launcher")

VLLM_WATCHDOG_TIME_S = 5.0


def is_valid_ipv6_address(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def create_server_socket(addr: tuple[str, int], *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if is_valid_ipv6_address(addr[0]) else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


def create_server_unix_socket(path: str) -> socket.socket:
    sock = socket.socket(family=socket.AF_UNIX, type=socket.SOCK_STREAM)
    sock.bind(path)
    return sock


def set_ulimit(target_soft_limit: int = 65535) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < target_soft_limit:
        try:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (min(target_soft_limit, hard), hard)
            )
        except ValueError as error:
            logger.warning("Found ulimit of %s and failed to raise it: %s", soft, error)


def setup_server(args, *, reuse_port: bool):
    """Validate API server args and create the server socket."""
    logger.info("vLLM API server version %s (vsnap stand-in)", VLLM_VERSION)
    logger.info("args: %s", args)
    validate_api_server_args(args)
    if args.ssl_keyfile or args.ssl_certfile or args.ssl_ca_certs:
        raise ValueError("the vsnap stand-in serves plaintext HTTP only (no TLS options)")
    if args.uds:
        sock = create_server_unix_socket(args.uds)
    else:
        sock_addr = (args.host or "", args.port)
        sock = create_server_socket(sock_addr, reuse_port=reuse_port)
    set_ulimit()
    if args.uds:
        listen_address = f"unix:{args.uds}"
    else:
        addr, port = sock_addr
        host_part = f"[{addr}]" if is_valid_ipv6_address(addr) else addr or "0.0.0.0"
        listen_address = f"http://{host_part}:{port}"
    return listen_address, sock


async def serve_http(app, sock: socket.socket | None, **kwargs: Any):
    """Serve ``app`` on ``sock`` until shutdown; returns a coroutine to await."""
    loop = asyncio.get_running_loop()
    limit = max(65536, int(kwargs.get("h11_max_incomplete_event_size") or 0))
    server = await asyncio.start_server(
        app.handle_connection, sock=sock, limit=limit, backlog=2048
    )
    pid = os.getpid()
    logger.info("Started server process [%d]", pid)
    logger.info("Waiting for application startup.")
    logger.info("Application startup complete.")
    for address in (s.getsockname() for s in server.sockets):
        logger.info("Uvicorn running on %s (Press CTRL+C to quit)", address)

    shutdown_event = asyncio.Event()

    def signal_handler() -> None:
        if not shutdown_event.is_set():
            logger.info("[shutdown] API server: shutdown triggered")
            shutdown_event.set()

    if os.environ.get("VSNAP_STANDIN_SERVE_SIGNALS") == "1":
        loop.add_signal_handler(signal.SIGINT, signal_handler)
        loop.add_signal_handler(signal.SIGTERM, signal_handler)

    async def watchdog() -> None:
        engine = app.engine_client
        while True:
            await asyncio.sleep(VLLM_WATCHDOG_TIME_S)
            if engine.errored and not envs.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH:
                logger.error("Engine is dead: shutting down the API server")
                shutdown_event.set()
                return

    watchdog_task = loop.create_task(watchdog())

    async def dummy_shutdown() -> None:
        pass

    try:
        await shutdown_event.wait()
    finally:
        watchdog_task.cancel()
        server.close()
        app.close_connections()
        logger.info("[shutdown] API server: shutting down HTTP server")
    return dummy_shutdown()
