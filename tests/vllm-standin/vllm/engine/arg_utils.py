"""EngineArgs / AsyncEngineArgs: the engine options of ``vllm serve`` the stand-in knows.

Each field is registered as ``--field-name`` (bools as ``BooleanOptionalAction``, so
``--enable-sleep-mode`` / ``--no-enable-sleep-mode``), with vLLM's short flags. The
engine honours ``model``, ``served_model_name``, ``max_model_len``, ``seed``,
``enable_sleep_mode`` and the parallel sizes (which must be 1); the rest is parsed and
kept but has no effect.
"""

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from vllm.utils.argparse_utils import human_readable_int, human_readable_int_or_auto

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"


def optional_type(kind):
    def parse(value: str):
        if value == "" or value.lower() in ("none", "null"):
            return None
        return kind(value)

    return parse


def _json(value: str):
    return json.loads(value)


# name -> (argparse kwargs, extra flags)
_ARGS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "model": ({"type": str, "default": DEFAULT_MODEL}, []),
    "served_model_name": ({"type": str, "nargs": "+", "default": None}, []),
    "tokenizer": ({"type": optional_type(str), "default": None}, []),
    "tokenizer_mode": ({"type": str, "default": "auto"}, []),
    "skip_tokenizer_init": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "revision": ({"type": optional_type(str), "default": None}, []),
    "code_revision": ({"type": optional_type(str), "default": None}, []),
    "tokenizer_revision": ({"type": optional_type(str), "default": None}, []),
    "trust_remote_code": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "download_dir": ({"type": optional_type(str), "default": None}, []),
    "load_format": ({"type": str, "default": "auto"}, []),
    "dtype": ({"type": str, "default": "auto"}, []),
    "kv_cache_dtype": ({"type": str, "default": "auto"}, []),
    "seed": ({"type": int, "default": 0}, []),
    "max_model_len": ({"type": human_readable_int_or_auto, "default": None}, []),
    "tensor_parallel_size": ({"type": int, "default": 1}, ["-tp"]),
    "pipeline_parallel_size": ({"type": int, "default": 1}, ["-pp"]),
    "data_parallel_size": ({"type": int, "default": 1}, ["-dp"]),
    "prefill_context_parallel_size": ({"type": int, "default": 1}, []),
    "decode_context_parallel_size": ({"type": int, "default": 1}, []),
    "data_parallel_multi_port_external_lb": (
        {"action": argparse.BooleanOptionalAction, "default": False},
        [],
    ),
    "distributed_executor_backend": ({"type": optional_type(str), "default": None}, []),
    "enable_expert_parallel": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "gpu_memory_utilization": ({"type": float, "default": 0.9}, []),
    "kv_cache_memory_bytes": ({"type": optional_type(human_readable_int), "default": None}, []),
    "block_size": ({"type": optional_type(int), "default": None}, []),
    "enable_prefix_caching": ({"action": argparse.BooleanOptionalAction, "default": None}, []),
    "enable_chunked_prefill": ({"action": argparse.BooleanOptionalAction, "default": None}, []),
    "max_num_batched_tokens": ({"type": optional_type(human_readable_int), "default": None}, []),
    "max_num_seqs": ({"type": optional_type(int), "default": None}, []),
    "max_logprobs": ({"type": int, "default": 20}, []),
    "logprobs_mode": (
        {
            "type": str,
            "default": "raw_logprobs",
            "choices": ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"],
        },
        [],
    ),
    "disable_log_stats": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "enable_log_requests": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "aggregate_engine_logging": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "enforce_eager": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "quantization": ({"type": optional_type(str), "default": None}, ["-q"]),
    "cpu_offload_gb": ({"type": float, "default": 0}, []),
    "enable_sleep_mode": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "enable_lora": ({"action": argparse.BooleanOptionalAction, "default": False}, []),
    "max_loras": ({"type": int, "default": 1}, []),
    "max_lora_rank": ({"type": int, "default": 16}, []),
    "speculative_config": ({"type": _json, "default": None}, []),
    "spec_method": ({"type": optional_type(str), "default": None}, []),
    "spec_model": ({"type": optional_type(str), "default": None}, []),
    "spec_tokens": ({"type": optional_type(int), "default": None}, []),
    "compilation_config": ({"type": _json, "default": None}, ["-cc"]),
    "optimization_level": ({"type": str, "default": "2"}, []),
    "kv_transfer_config": ({"type": _json, "default": None}, []),
    "generation_config": ({"type": str, "default": "auto"}, []),
    "override_generation_config": ({"type": _json, "default": None}, []),
    "hf_overrides": ({"type": _json, "default": None}, []),
    "limit_mm_per_prompt": ({"type": _json, "default": None}, []),
    "reasoning_parser": ({"type": str, "default": ""}, []),
    "reasoning_parser_plugin": ({"type": optional_type(str), "default": None}, []),
    "structured_outputs_config": ({"type": _json, "default": None}, []),
    "worker_cls": ({"type": str, "default": "auto"}, []),
    "worker_extension_cls": ({"type": str, "default": ""}, []),
    "async_scheduling": ({"action": argparse.BooleanOptionalAction, "default": None}, []),
    "shutdown_timeout": ({"type": int, "default": 0}, []),
    "max_parallel_loading_workers": ({"type": optional_type(int), "default": None}, []),
}


@dataclass
class EngineArgs:
    values: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    @classmethod
    def add_cli_args(cls, parser):
        group = parser.add_argument_group(title="EngineArgs", description=cls.__doc__)
        for name, (kwargs, flags) in _ARGS.items():
            group.add_argument(f"--{name.replace('_', '-')}", *flags, **dict(kwargs))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(values={name: getattr(args, name, None) for name in _ARGS})

    def create_engine_config(self, usage_context: Any = None) -> "VllmConfig":
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "prefill_context_parallel_size",
            "decode_context_parallel_size",
        ):
            if self.values.get(name) not in (None, 1):
                raise ValueError(f"the vsnap stand-in runs one engine core: {name} must be 1")
        model = self.values["model"]
        weights_dir = os.environ.get("VSNAP_STANDIN_WEIGHTS_DIR") or model
        if not os.path.isdir(weights_dir):
            raise ValueError(
                f"model {model!r}: the vsnap stand-in reads a local model folder "
                "(make one with tests/vllm-standin/make_model.py), or the folder "
                "named by VSNAP_STANDIN_WEIGHTS_DIR"
            )
        with open(os.path.join(weights_dir, "config.json")) as f:
            hf_config = json.load(f)
        max_model_len = self.values.get("max_model_len")
        if max_model_len in (None, -1):
            max_model_len = int(hf_config.get("max_position_embeddings", 2048))
        names = self.values.get("served_model_name") or [model]
        model_config = ModelConfig(
            model=model,
            served_model_name=names[0],
            served_model_names=list(names),
            weights_dir=weights_dir,
            max_model_len=max_model_len,
            seed=self.values.get("seed"),
            enable_sleep_mode=bool(self.values.get("enable_sleep_mode")),
            hf_config=hf_config,
        )
        kv_mb = int(os.environ.get("VSNAP_STANDIN_KV_CACHE_MB", "8"))
        return VllmConfig(
            model_config=model_config,
            shutdown_timeout=int(self.values.get("shutdown_timeout") or 0),
            kv_cache_mb=kv_mb,
        )


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Engine options for the async engine (the API server's)."""


@dataclass
class ModelConfig:
    model: str
    served_model_name: str
    served_model_names: list[str]
    weights_dir: str
    max_model_len: int
    seed: int | None
    enable_sleep_mode: bool
    hf_config: dict


@dataclass
class VllmConfig:
    model_config: ModelConfig
    shutdown_timeout: int
    kv_cache_mb: int


def engine_arg_names() -> list[str]:
    return list(_ARGS)

