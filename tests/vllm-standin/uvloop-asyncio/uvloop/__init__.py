"""asyncio in uvloop's clothes (vsnap stand-in, optional).

The fixture's rootfs has the real uvloop wheel in dist-packages. Its libuv (1.52)
creates an io_uring instance for every event loop on recent kernels (for epoll
batching; UV_USE_IO_URING does not turn that off, only kernel.io_uring_disabled does),
so PID 1 holds an ``anon_inode:[io_uring]`` fd, as a real vLLM server does. Putting
this folder's parent first on the path (``PYTHONPATH=/opt/standin/asyncio-uvloop``)
makes ``import uvloop`` resolve here instead: the stdlib's epoll event loop, no io_uring.
"""

import asyncio

__version__ = "0.0.0+vsnap.asyncio"
VSNAP_STANDIN = True

Loop = asyncio.SelectorEventLoop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return asyncio.new_event_loop()


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    def _loop_factory(self) -> asyncio.AbstractEventLoop:
        return new_event_loop()


def install() -> None:
    asyncio.set_event_loop_policy(EventLoopPolicy())


def run(main, *, loop_factory=new_event_loop, debug=None, **run_kwargs):
    """uvloop.run: asyncio.Runner with this module's loop factory."""
    with asyncio.Runner(loop_factory=loop_factory, debug=debug) as runner:
        return runner.run(main)
