"""A fake LLM upstream: one threaded HTTP server on 127.0.0.1 speaking three wire formats.

* OpenAI Chat Completions — ``POST /v1/chat/completions`` (``"stream": true`` → SSE)
* Anthropic Messages — ``POST /v1/messages`` (``"stream": true`` → SSE events)
* Gemini — ``POST /v1beta/models/{model}:generateContent`` and
  ``:streamGenerateContent?alt=sse``

Every request is recorded (:attr:`FakeUpstream.requests`: method, path, query, headers,
body). Faults are scripted per vendor as a FIFO queue (:meth:`FakeUpstream.script`);
a request with nothing scripted gets a healthy answer. Fault builders live in
:class:`Faults` and produce each vendor's documented error body.

Streaming (issue 5) can extend :meth:`_Handler._stream` and add fault kinds; the
request log and the queues stay as they are.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from llm_routing.providers.mock import instance_from_schema

__all__ = ["FakeUpstream", "Fault", "Faults", "RecordedRequest"]

VENDORS = ("openai", "anthropic", "gemini")


@dataclass(frozen=True)
class RecordedRequest:
    vendor: str
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass(frozen=True)
class Fault:
    """What to do with one request.

    ``action``: ``respond`` (``status``/``headers``/``body``; ``body=None`` → the
    vendor's healthy answer), ``reset`` (TCP RST before any header), ``hang`` (accept,
    read, never answer), ``close`` (close the socket cleanly before any header).
    ``delay`` waits before the first byte. ``echo_key`` appends the key the request
    carried to the error message (the way some vendors echo a bad key).
    """

    action: str = "respond"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # dict → JSON; bytes → raw; None → healthy answer
    delay: float = 0.0
    echo_key: bool = False


def _openai_error(status: int, message: str, type_: str, code: str | None) -> Fault:
    return Fault(
        status=status,
        body={"error": {"message": message, "type": type_, "param": None, "code": code}},
    )


def _anthropic_error(status: int, type_: str, message: str) -> Fault:
    return Fault(
        status=status,
        body={
            "type": "error",
            "error": {"type": type_, "message": message},
            "request_id": "req_011CFakeUpstream",
        },
    )


def _gemini_error(status: int, code_name: str, message: str, reason: str | None = None) -> Fault:
    error: dict[str, Any] = {"code": status, "message": message, "status": code_name}
    if reason:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        ]
    return Fault(status=status, body={"error": error})


class Faults:
    """Builders of each vendor's documented failure answers."""

    @staticmethod
    def ok(**kwargs: Any) -> Fault:
        return Fault(**kwargs)

    @staticmethod
    def rate_limit(
        vendor: str,
        *,
        retry_after: str | None = None,
        retry_after_ms: str | None = None,
        retry_after_date_in: float | None = None,
    ) -> Fault:
        fault = {
            "openai": lambda: _openai_error(
                429,
                "Rate limit reached for requests. Please try again in 1s.",
                "requests",
                "rate_limit_exceeded",
            ),
            "anthropic": lambda: _anthropic_error(
                429, "rate_limit_error", "Number of requests has exceeded your rate limit."
            ),
            "gemini": lambda: _gemini_error(
                429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."
            ),
        }[vendor]()
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["retry-after"] = retry_after
        if retry_after_ms is not None:
            headers["retry-after-ms"] = retry_after_ms
        if retry_after_date_in is not None:
            headers["retry-after"] = formatdate(time.time() + retry_after_date_in, usegmt=True)
        return Fault(status=429, headers=headers, body=fault.body)

    @staticmethod
    def unavailable(vendor: str, status: int = 503) -> Fault:
        if vendor == "openai":
            return _openai_error(
                status, "The server is overloaded or not ready yet.", "server_error", None
            )
        if vendor == "anthropic":
            if status == 529:
                return _anthropic_error(529, "overloaded_error", "Overloaded")
            return _anthropic_error(status, "api_error", "Internal server error")
        name = {500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}.get(
            status, "UNAVAILABLE"
        )
        return _gemini_error(status, name, "The model is overloaded. Please try again later.")

    @staticmethod
    def overloaded() -> Fault:
        return _anthropic_error(529, "overloaded_error", "Overloaded")

    @staticmethod
    def auth(vendor: str, *, echo_key: bool = True) -> Fault:
        if vendor == "openai":
            fault = _openai_error(
                401, "Incorrect API key provided: ", "invalid_request_error", "invalid_api_key"
            )
        elif vendor == "anthropic":
            fault = _anthropic_error(401, "authentication_error", "invalid x-api-key: ")
        else:  # Gemini answers a bad key with 400 INVALID_ARGUMENT + API_KEY_INVALID
            fault = _gemini_error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key. ",
                reason="API_KEY_INVALID",
            )
        return Fault(status=fault.status, body=fault.body, echo_key=echo_key)

    @staticmethod
    def context_length(vendor: str) -> Fault:
        if vendor == "openai":
            fault = _openai_error(
                400,
                "This model's maximum context length is 128000 tokens. However, your "
                "messages resulted in 150000 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
            )
            return Fault(status=400, body={"error": {**fault.body["error"], "param": "messages"}})
        if vendor == "anthropic":
            return _anthropic_error(
                400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
            )
        return _gemini_error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576).",
        )

    @staticmethod
    def content_policy(vendor: str) -> Fault:
        if vendor == "openai":
            return _openai_error(
                400,
                "Your request was rejected as a result of our safety system.",
                "invalid_request_error",
                "content_policy_violation",
            )
        if vendor == "anthropic":
            return _anthropic_error(
                400, "invalid_request_error", "Output blocked by content filtering policy"
            )
        # Gemini blocks a prompt with a 200 carrying promptFeedback.blockReason.
        return Fault(
            status=200,
            body={
                "promptFeedback": {"blockReason": "SAFETY"},
                "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 5},
                "modelVersion": "gemini-fake",
            },
        )

    @staticmethod
    def invalid_request(vendor: str) -> Fault:
        if vendor == "openai":
            return _openai_error(
                400, "Invalid value for 'temperature'.", "invalid_request_error", None
            )
        if vendor == "anthropic":
            return _anthropic_error(400, "invalid_request_error", "max_tokens: field required")
        return _gemini_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")

    @staticmethod
    def error_body_200(vendor: str, code: int = 502) -> Fault:
        """A 200 whose body is an error object (OpenRouter and proxies do this)."""
        if vendor == "anthropic":
            return Fault(
                status=200,
                body={
                    "type": "error",
                    "error": {"type": "overloaded_error", "message": "Overloaded"},
                },
            )
        if vendor == "gemini":
            return Fault(
                status=200,
                body={"error": {"code": 503, "message": "Unavailable", "status": "UNAVAILABLE"}},
            )
        return Fault(
            status=200, body={"error": {"code": code, "message": "Upstream provider error"}}
        )

    @staticmethod
    def malformed() -> Fault:
        return Fault(status=200, body=b'{"choices": [{"message": ')

    @staticmethod
    def reset() -> Fault:
        return Fault(action="reset")

    @staticmethod
    def close() -> Fault:
        return Fault(action="close")

    @staticmethod
    def hang() -> Fault:
        return Fault(action="hang")

    @staticmethod
    def slow(delay: float) -> Fault:
        return Fault(delay=delay)


# --- healthy answers ------------------------------------------------------------------
def _answer_text(body: Any) -> str:
    return f"fake answer ({len(json.dumps(body))} bytes of request)"


def _openai_ok(body: dict[str, Any]) -> dict[str, Any]:
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    content = json.dumps(instance_from_schema(schema)) if schema else _answer_text(body)
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": f"{body.get('model', 'unknown')}-2024-fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _anthropic_ok(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools") or []
    if tools:
        content: list[dict[str, Any]] = [
            {
                "type": "tool_use",
                "id": "toolu_fake",
                "name": tools[0]["name"],
                "input": instance_from_schema(tools[0].get("input_schema") or {}),
            }
        ]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": _answer_text(body)}]
        stop = "end_turn"
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": f"{body.get('model', 'unknown')}-fake",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 8},
    }


def _gemini_ok(body: dict[str, Any], model: str) -> dict[str, Any]:
    config = body.get("generationConfig") or {}
    schema = config.get("responseSchema")
    text = json.dumps(instance_from_schema(schema)) if schema else _answer_text(body)
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 13,
            "candidatesTokenCount": 9,
            "totalTokenCount": 22,
        },
        "modelVersion": f"{model}-fake",
        "responseId": "fake-response",
    }


def _sse_events(vendor: str, body: dict[str, Any], model: str) -> Iterator[bytes]:
    words = _answer_text(body).split(" ")
    if vendor == "openai":
        for i, word in enumerate(words):
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": word if i == 0 else " " + word},
                        "finish_reason": None,
                    }
                ],
            }
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        done = {
            "id": "chatcmpl-fake",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        yield b"data: " + json.dumps(done).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    elif vendor == "anthropic":

        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        yield event(
            "message_start",
            {"type": "message_start", "message": {**_anthropic_ok(body), "content": []}},
        )
        yield event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        for i, word in enumerate(words):
            yield event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": word if i == 0 else " " + word},
                },
            )
        yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 8},
            },
        )
        yield event("message_stop", {"type": "message_stop"})
    else:
        for i, word in enumerate(words):
            chunk = _gemini_ok(body, model)
            chunk["candidates"][0]["content"]["parts"] = [{"text": word if i == 0 else " " + word}]
            if i < len(words) - 1:
                chunk["candidates"][0].pop("finishReason")
            yield b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without NODELAY, Nagle + delayed
        # ACK add ~40 ms to every answer and drown the numbers of bench/.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        self._send(404, {"error": {"message": "Not found"}})

    def do_POST(self) -> None:
        fake = self.server.fake
        split = urlsplit(self.path)
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        vendor, model, streaming = self._route(split.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake._record(
            RecordedRequest(vendor or "unknown", "POST", split.path, split.query, headers, body)
        )
        if vendor is None:
            self._send(404, {"error": {"message": f"No route for {split.path}"}})
            return
        fault = fake._next_fault(vendor)
        if fault.delay:
            time.sleep(fault.delay)
        if fault.action == "reset":
            self._reset()
            return
        if fault.action == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault.action == "hang":
            fake._release.wait(timeout=60)
            self._reset()
            return
        try:
            request_json = json.loads(body or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "Invalid JSON payload"}})
            return
        if fault.body is None:
            if streaming or (isinstance(request_json, dict) and request_json.get("stream")):
                self._stream(vendor, request_json, model)
                return
            answer = {
                "openai": lambda: _openai_ok(request_json),
                "anthropic": lambda: _anthropic_ok(request_json),
                "gemini": lambda: _gemini_ok(request_json, model),
            }[vendor]()
            self._send(fault.status, answer, fault.headers)
            return
        payload = fault.body
        if fault.echo_key and isinstance(payload, dict):
            payload = self._echo_key(payload, headers)
        self._send(fault.status, payload, fault.headers)

    # --- helpers --------------------------------------------------------------------
    @staticmethod
    def _route(path: str) -> tuple[str | None, str, bool]:
        if path.endswith("/chat/completions"):
            return "openai", "", False
        if path.endswith("/v1/messages"):
            return "anthropic", "", False
        if "/models/" in path and ":" in path.rsplit("/", 1)[-1]:
            model, method = path.rsplit("/", 1)[-1].split(":", 1)
            if method == "generateContent":
                return "gemini", model, False
            if method == "streamGenerateContent":
                return "gemini", model, True
        return None, "", False

    @staticmethod
    def _echo_key(payload: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        key = (
            headers.get("x-api-key")
            or headers.get("x-goog-api-key")
            or headers.get("authorization", "").removeprefix("Bearer ")
        )
        error = dict(payload.get("error") or {})
        error["message"] = f"{error.get('message', '')}{key}"
        return {**payload, "error": error}

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _stream(self, vendor: str, body: dict[str, Any], model: str) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        for event in _sse_events(vendor, body, model):
            self.wfile.write(event)
            self.wfile.flush()

    def _reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0) before any header."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeUpstream


class FakeUpstream:
    """Start with :meth:`start`, stop with :meth:`stop` (the pytest fixture does both)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str, deque[Fault]] = {v: deque() for v in VENDORS}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> FakeUpstream:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- scripting ------------------------------------------------------------------
    def script(self, vendor: str, *faults: Fault) -> None:
        """Queue ``faults`` for the next requests to ``vendor`` (FIFO)."""
        if vendor not in self._queues:
            raise ValueError(f"unknown vendor {vendor!r}")
        with self._lock:
            self._queues[vendor].extend(faults)

    def _next_fault(self, vendor: str) -> Fault:
        with self._lock:
            queue = self._queues[vendor]
            return queue.popleft() if queue else Fault()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def requests_for(self, vendor: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.vendor == vendor]

    def pending(self, vendor: str) -> int:
        with self._lock:
            return len(self._queues[vendor])
