"""vsnap's stand-in for vLLM 0.33.0.

Everything in this package is a small stand-in written for vsnap's tests, except
``vllm.snapshot``, which the fixture (scripts/vllm-fixture.sh) copies unmodified from
the vLLM 0.33.0 wheel. The stand-in provides exactly the names ``vllm.snapshot.server``
imports and calls, with the signatures and behaviour it relies on; see
tests/vllm-standin/README.md.
"""

# Like vLLM's own __init__, keep the package import light: a spawned EngineCore
# imports it again before it runs anything.
import typing

from .version import __version__, __version_tuple__  # noqa: F401

STANDIN = True

MODULE_ATTRS = {
    "AsyncEngineArgs": ".engine.arg_utils:AsyncEngineArgs",
    "EngineArgs": ".engine.arg_utils:EngineArgs",
    "AsyncLLMEngine": ".v1.engine.async_llm:AsyncLLM",
    "SamplingParams": ".sampling_params:SamplingParams",
    "CompletionOutput": ".outputs:CompletionOutput",
    "RequestOutput": ".outputs:RequestOutput",
}


def __getattr__(name: str) -> typing.Any:
    from importlib import import_module

    if name in MODULE_ATTRS:
        module_name, attr_name = MODULE_ATTRS[name].split(":")
        module = import_module(module_name, __package__)
        return getattr(module, attr_name)
    raise AttributeError(f"module {__package__} has no attribute {name}")


__all__ = ["__version__", "__version_tuple__", *MODULE_ATTRS]
