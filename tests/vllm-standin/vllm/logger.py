"""vLLM-style logging: ``INFO 12-01 20:10:00 [file.py:42] message`` on stdout."""

import logging
import sys

from vllm import envs

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
_configured = False
_prefix = ""


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _prefix + super().format(record)


def _configure_root() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("vllm")
    if not envs.VLLM_CONFIGURE_LOGGING:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(envs.VLLM_LOGGING_LEVEL)
    root.propagate = False


def set_process_prefix(prefix: str) -> None:
    """Prefix every line of this process, as vLLM's decorate_logs does."""
    global _prefix
    _prefix = prefix


def init_logger(name: str) -> logging.Logger:
    _configure_root()
    return logging.getLogger(name)
