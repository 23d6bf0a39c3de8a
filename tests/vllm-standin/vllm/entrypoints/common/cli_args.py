"""vLLM's serve argument parser (``make_arg_parser``) and its checks, stand-in.

The same layout as vLLM 0.33.0's: the positional ``model_tag``, ``--headless``,
``--api-server-count/-asc``, ``--config``, ``--grpc``, the frontend options
(FrontendArgs) and the engine options (``AsyncEngineArgs.add_cli_args``).
"""

import argparse
import json
import ssl
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs, optional_type
from vllm.utils.argparse_utils import FlexibleArgumentParser

_FRONTEND_ARGS: dict[str, dict[str, Any]] = {
    "host": {"type": optional_type(str), "default": None},
    "port": {"type": int, "default": 8000},
    "grpc_port": {"type": optional_type(int), "default": None},
    "uds": {"type": optional_type(str), "default": None},
    "uvicorn_log_level": {
        "type": str,
        "default": "info",
        "choices": ["critical", "error", "warning", "info", "debug", "trace"],
    },
    "disable_uvicorn_access_log": {"action": argparse.BooleanOptionalAction, "default": False},
    "disable_access_log_for_endpoints": {"type": optional_type(str), "default": None},
    "allow_credentials": {"action": argparse.BooleanOptionalAction, "default": False},
    "allowed_origins": {"type": json.loads, "default": []},
    "allowed_methods": {"type": json.loads, "default": ["*"]},
    "allowed_headers": {"type": json.loads, "default": ["*"]},
    "api_key": {"type": optional_type(str), "nargs": "+", "default": None},
    "ssl_keyfile": {"type": optional_type(str), "default": None},
    "ssl_certfile": {"type": optional_type(str), "default": None},
    "ssl_ca_certs": {"type": optional_type(str), "default": None},
    "enable_ssl_refresh": {"action": argparse.BooleanOptionalAction, "default": False},
    "ssl_cert_reqs": {"type": int, "default": int(ssl.CERT_NONE)},
    "ssl_ciphers": {"type": optional_type(str), "default": None},
    "root_path": {"type": optional_type(str), "default": None},
    "middleware": {"type": str, "action": "append", "default": []},
    "enable_request_id_headers": {"action": argparse.BooleanOptionalAction, "default": False},
    "disable_fastapi_docs": {"action": argparse.BooleanOptionalAction, "default": False},
    "h11_max_incomplete_event_size": {"type": int, "default": 4194304},
    "h11_max_header_count": {"type": int, "default": 256},
    "lora_modules": {"type": optional_type(str), "nargs": "+", "default": None},
    "chat_template": {"type": optional_type(str), "default": None},
    "response_role": {"type": str, "default": "assistant"},
    "return_tokens_as_token_ids": {"action": argparse.BooleanOptionalAction, "default": False},
    "enable_auto_tool_choice": {"action": argparse.BooleanOptionalAction, "default": False},
    "tool_call_parser": {"type": optional_type(str), "default": None},
    "tool_parser_plugin": {"type": str, "default": ""},
    "max_log_len": {"type": optional_type(int), "default": None},
    "enable_prompt_tokens_details": {"action": argparse.BooleanOptionalAction, "default": False},
    "enable_server_load_tracking": {"action": argparse.BooleanOptionalAction, "default": False},
    "enable_force_include_usage": {"action": argparse.BooleanOptionalAction, "default": False},
    "enable_tokenizer_info_endpoint": {"action": argparse.BooleanOptionalAction, "default": False},
    "enable_log_outputs": {"action": argparse.BooleanOptionalAction, "default": False},
    "log_error_stack": {"action": argparse.BooleanOptionalAction, "default": False},
    "tokens_only": {"action": argparse.BooleanOptionalAction, "default": False},
}


def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    parser.add_argument(
        "model_tag",
        type=str,
        nargs="?",
        help="The model tag to serve (optional if specified in config)",
    )
    parser.add_argument("--headless", action="store_true", default=False)
    parser.add_argument("--api-server-count", "-asc", type=int, default=None)
    parser.add_argument("--config", help="Read CLI options from a config file.")
    parser.add_argument("--grpc", action="store_true", default=False)
    group = parser.add_argument_group(title="Frontend")
    for name, kwargs in _FRONTEND_ARGS.items():
        group.add_argument(f"--{name.replace('_', '-')}", **dict(kwargs))
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """Quick checks for model serve args that raise prior to loading."""
    if hasattr(args, "subparser") and args.subparser not in ("serve", "launch"):
        return
    if args.grpc_port is not None:
        if args.grpc:
            raise ValueError("--grpc and --grpc-port are mutually exclusive.")
        raise ValueError("--grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_log_outputs and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")


def validate_api_server_args(args: argparse.Namespace) -> None:
    if args.enable_auto_tool_choice:
        raise KeyError(
            f"invalid tool call parser: {args.tool_call_parser} (the vsnap stand-in has none)"
        )


def init_parser_plugin(args: argparse.Namespace) -> None:
    return None


def propagate_flash_late_interaction(args, engine_args) -> None:
    return None
