"""ZMQ endpoints and sockets, as vLLM 0.33's ``vllm.utils.network_utils`` makes them.

``get_open_zmq_ipc_path()`` names a fresh ``ipc://`` endpoint under
``VLLM_RPC_BASE_PATH`` (``tempfile.gettempdir()``, so ``/tmp``): a Unix socket file
``/tmp/<uuid4>`` once a ZMQ socket binds it. libzmq (4.3.5, bundled in pyzmq 27)
never removes that file: not on close, not on unbind, not on ``Context.term()``; it
removes a file left at the path only when it binds there again. A closed endpoint
therefore leaves a stale socket file in /tmp that nothing holds.
"""

from uuid import uuid4

import zmq

from vllm import envs


def get_open_zmq_ipc_path() -> str:
    base_rpc_path = envs.VLLM_RPC_BASE_PATH
    return f"ipc://{base_rpc_path}/{uuid4()}"


def make_zmq_socket(
    ctx: zmq.Context,
    path: str,
    socket_type: int,
    bind: bool | None = None,
    identity: bytes | None = None,
    linger: int | None = None,
) -> zmq.Socket:
    """A ZMQ socket bound or connected to ``path``.

    As vLLM's: without ``bind``, every type but PUSH/SUB/XSUB binds; high-water marks
    are off (no message is ever dropped or blocks for queue space).
    """
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if linger is not None:
        sock.setsockopt(zmq.LINGER, linger)
    if bind is None:
        bind = socket_type not in (zmq.PUSH, zmq.SUB, zmq.XSUB)
    if bind:
        sock.bind(path)
    else:
        sock.connect(path)
    return sock
