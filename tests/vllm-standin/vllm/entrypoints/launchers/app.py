"""The OpenAI-compatible HTTP frontend, stand-in: asyncio and the standard library only.

HTTP/1.1 with keep-alive (idle timeout VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), bodies
with Content-Length or chunked. Routes, as vLLM's:

* ``GET /health`` (200, empty; 503 once the engine is dead), ``GET /version``;
* ``GET /v1/models``;
* ``GET /v1/identity`` (vsnap, identity.py): ``hostname``, ``pod_ips``, ``seed_applied``
  and two draws from ``random`` (``random``, ``getrandbits`` of 64 bits);
* ``POST /v1/completions`` (non-streaming): ``model``, ``prompt`` (a string, a list of
  strings, or a list of token ids), ``max_tokens`` (default 16), ``min_tokens``,
  ``temperature`` (default 1.0; 0 is greedy), ``top_p``, ``top_k``, ``seed``,
  ``logprobs`` (0..``--max-logprobs``), ``return_token_ids``, ``n`` (1), ``stream``
  (false), ``echo`` (false); other fields are ignored.

With ``--api-key K...`` (or, when that is absent, ``VLLM_API_KEY``) every request
whose path starts with /v1, /v2, /inference or /cohere needs
``Authorization: Bearer K`` (OPTIONS excepted), else 401 ``{"error": "Unauthorized"}``,
as vLLM's AuthenticationMiddleware. Errors otherwise have vLLM's shape
``{"error": {"message", "type", "param", "code"}}``.
"""

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from email.utils import formatdate
from typing import Any

from vllm import envs
from vllm.entrypoints.launchers import identity as vsnap_identity
from vllm.logger import init_logger
from vllm.model_executor import standin_lm
from vllm.sampling_params import SamplingParams
from vllm.version import __version__ as VLLM_VERSION

logger = init_logger("vllm.entrypoints.launchers.app")

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_MAX_BODY = 16 << 20


class HTTPError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind or {
            400: "BadRequestError",
            404: "NotFoundError",
            500: "InternalServerError",
            503: "ServiceUnavailableError",
        }.get(status, "Error")

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


def _random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIApp:
    def __init__(self, args: Any, supported_tasks: tuple, engine_client: Any) -> None:
        self.args = args
        self.engine_client = engine_client
        self.supported_tasks = supported_tasks
        model_config = engine_client.model_config
        self.served_names = list(model_config.served_model_names)
        self.model_root = model_config.model
        self.max_model_len = model_config.max_model_len
        self.max_logprobs = getattr(args, "max_logprobs", 20)
        tokens = [key for key in (args.api_key or [envs.VLLM_API_KEY]) if key]
        self.api_tokens = [hashlib.sha256(t.encode("utf-8")).digest() for t in tokens]
        self.access_log = not getattr(args, "disable_uvicorn_access_log", False)
        self.keep_alive_s = envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
        self.max_headers = getattr(args, "h11_max_header_count", 256)
        self._writers: set[asyncio.StreamWriter] = set()

    # -- connections ---------------------------------------------------------------
    def close_connections(self) -> None:
        for writer in list(self._writers):
            writer.close()

    async def handle_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        peer = writer.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), self.keep_alive_s
                    )
                except (asyncio.TimeoutError, asyncio.IncompleteReadError,
                        ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, 431, {"detail": "header too large"}, close=True)
                    return
                try:
                    method, path, version, headers = self._parse_head(head)
                    body = await self._read_body(reader, headers)
                except HTTPError as error:
                    await self._send(writer, error.status, error.body(), close=True)
                    return
                connection = headers.get("connection", "").lower()
                close = version == "HTTP/1.0" and connection != "keep-alive"
                close = close or connection == "close"
                status, payload = await self._dispatch(method, path, headers, body)
                await self._send(writer, status, payload, close=close)
                if self.access_log:
                    print(
                        f'INFO:     {peer_text} - "{method} {path} {version}" '
                        f"{status} {_REASONS.get(status, '')}",
                        flush=True,
                    )
                if close:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            self._writers.discard(writer)
            try:
                writer.close()
            except Exception:
                pass

    def _parse_head(self, head: bytes):
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HTTPError(400, "malformed request line")
        if len(lines) - 1 > self.max_headers:
            raise HTTPError(400, "too many headers")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HTTPError(400, "malformed header")
            headers[name.lower()] = value.strip()
        return parts[0], parts[1], parts[2], headers

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    return bytes(body)
                if len(body) + size > _MAX_BODY:
                    raise HTTPError(413, "request body too large")
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        length = headers.get("content-length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            raise HTTPError(400, "bad Content-Length") from None
        if n < 0 or n > _MAX_BODY:
            raise HTTPError(413, "request body too large")
        return await reader.readexactly(n)

    async def _send(self, writer: asyncio.StreamWriter, status: int, payload: Any,
                    *, close: bool) -> None:
        # As Starlette's JSONResponse.
        body = b"" if payload is None else json.dumps(
            payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
            f"date: {formatdate(usegmt=True)}",
            "server: uvicorn",
            f"content-length: {len(body)}",
        ]
        if payload is not None:
            head.append("content-type: application/json")
        if close:
            head.append("connection: close")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()

    # -- routing -------------------------------------------------------------------
    def _authorized(self, headers: dict) -> bool:
        value = headers.get("authorization")
        if not value:
            return False
        scheme, _, param = value.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for token in self.api_tokens:
            match |= secrets.compare_digest(digest, token)
        return match

    async def _dispatch(self, method: str, target: str, headers: dict, body: bytes):
        path = target.split("?", 1)[0]
        if (
            self.api_tokens
            and method != "OPTIONS"
            and path.startswith(GUARDED_PREFIX)
            and not self._authorized(headers)
        ):
            return 401, {"error": "Unauthorized"}
        routes = {
            "/health": ("GET", self.health),
            "/version": ("GET", self.version),
            "/v1/models": ("GET", self.models),
            "/v1/identity": ("GET", self.identity),
            "/v1/completions": ("POST", self.completions),
        }
        if path not in routes:
            return 404, {"detail": "Not Found"}
        wanted, handler = routes[path]
        if method != wanted:
            return 405, {"detail": "Method Not Allowed"}
        try:
            return await handler(body)
        except HTTPError as error:
            return error.status, error.body()
        except Exception as error:  # the engine failed the request
            logger.exception("request failed")
            return 500, HTTPError(500, f"{type(error).__name__}: {error}").body()

    async def health(self, body: bytes):
        if self.engine_client.errored:
            return 503, None
        return 200, None

    async def identity(self, body: bytes):
        return 200, vsnap_identity.report()

    async def version(self, body: bytes):
        return 200, {"version": VLLM_VERSION}

    async def models(self, body: bytes):
        now = int(time.time())
        cards = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": self.model_root,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{_random_uuid()}",
                        "object": "model_permission",
                        "created": now,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.served_names
        ]
        return 200, {"object": "list", "data": cards}

    # -- /v1/completions -----------------------------------------------------------
    def _parse_completion(self, body: bytes):
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            raise HTTPError(400, f"JSON decode error: {error}") from None
        if not isinstance(request, dict):
            raise HTTPError(400, "the request body must be a JSON object")

        def field(name, kinds, default=None, *, check=None, message=None):
            value = request.get(name, default)
            if value is None:
                return default
            if isinstance(value, bool) and bool not in kinds:
                raise HTTPError(400, f"{name}: expected {message or kinds}", param=name)
            if not isinstance(value, kinds):
                raise HTTPError(400, f"{name}: expected {message or kinds}", param=name)
            if check is not None and not check(value):
                raise HTTPError(400, f"{name}: {message}", param=name)
            return value

        model = field("model", (str,))
        if model is not None and model not in self.served_names:
            raise HTTPError(404, f"The model `{model}` does not exist.", param="model")
        prompt = request.get("prompt")
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = list(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)
        ):
            prompts = [{"prompt_token_ids": list(prompt)}]
        else:
            raise HTTPError(
                400, "prompt: a string, a list of strings or a list of token ids",
                param="prompt",
            )
        if field("stream", (bool,), False):
            raise HTTPError(400, "stream: the vsnap stand-in does not stream", param="stream")
        if field("echo", (bool,), False):
            raise HTTPError(400, "echo: not supported by the vsnap stand-in", param="echo")
        n = field("n", (int,), 1)
        if n != 1:
            raise HTTPError(400, "n: only 1 is supported by the vsnap stand-in", param="n")
        logprobs = field("logprobs", (int,), None, message="an integer")
        if logprobs is not None and not 0 <= logprobs <= self.max_logprobs:
            raise HTTPError(
                400,
                f"logprobs: must be between 0 and {self.max_logprobs}, got {logprobs}",
                param="logprobs",
            )
        number = (int, float)
        try:
            params = SamplingParams(
                max_tokens=field("max_tokens", (int,), 16, message="an integer"),
                min_tokens=field("min_tokens", (int,), 0, message="an integer"),
                temperature=float(field("temperature", number, 1.0, message="a number")),
                top_p=float(field("top_p", number, 1.0, message="a number")),
                top_k=field("top_k", (int,), 0, message="an integer"),
                seed=field("seed", (int,), None, message="an integer"),
                logprobs=logprobs,
            )
        except ValueError as error:
            raise HTTPError(400, str(error)) from None
        return_token_ids = bool(field("return_token_ids", (bool,), False))
        return model or self.served_names[0], prompts, params, return_token_ids

    async def completions(self, body: bytes):
        model, prompts, params, return_token_ids = self._parse_completion(body)
        request_id = f"cmpl-{_random_uuid()}"
        choices = []
        prompt_tokens = completion_tokens = 0
        for index, prompt in enumerate(prompts):
            final = None
            async for output in self.engine_client.generate(
                prompt, params, f"{request_id}-{index}"
            ):
                final = output
            candidate = final.outputs[0]
            token_ids = list(candidate.token_ids)
            prompt_tokens += len(final.prompt_token_ids)
            completion_tokens += len(token_ids)
            choice_logprobs = None
            if params.logprobs is not None:
                tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
                offset = 0
                for tid, position in zip(token_ids, candidate.logprobs):
                    text = standin_lm.decode_token(tid)
                    tokens.append(text)
                    token_logprobs.append(max(position[tid].logprob, -9999.0))
                    offsets.append(offset)
                    offset += len(text)
                    top_logprobs.append(
                        {
                            lp.decoded_token: max(lp.logprob, -9999.0)
                            for lp in list(position.values())[: params.logprobs + 1]
                        }
                    )
                choice_logprobs = {
                    "text_offset": offsets,
                    "token_logprobs": token_logprobs,
                    "tokens": tokens,
                    "top_logprobs": top_logprobs,
                }
            choices.append(
                {
                    "index": index,
                    "text": candidate.text,
                    "logprobs": choice_logprobs,
                    "finish_reason": candidate.finish_reason,
                    "stop_reason": None,
                    "token_ids": token_ids if return_token_ids else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": (
                        list(final.prompt_token_ids) if return_token_ids else None
                    ),
                }
            )
        return 200, {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }


def build_app(args: Any, supported_tasks: tuple, engine_client: Any) -> OpenAIApp:
    return OpenAIApp(args, supported_tasks, engine_client)

