"""A fake LLM upstream: one threaded HTTP server on 127.0.0.1 speaking three wire formats.

* OpenAI Chat Completions — ``POST /v1/chat/completions`` (``"stream": true`` → SSE)
* Anthropic Messages — ``POST /v1/messages`` (``"stream": true`` → SSE events)
* Gemini — ``POST /v1beta/models/{model}:generateContent`` and
  ``:streamGenerateContent?alt=sse``

Embeddings, in each vendor's wire format: OpenAI's ``POST /v1/embeddings`` (base64
little-endian float32 when the request asks ``encoding_format: "base64"``, JSON
numbers otherwise; ``usage.prompt_tokens`` a token per word) and Gemini's
``:embedContent`` / ``:batchEmbedContents`` (no usage, as Gemini). The vectors are
deterministic per text, of the request's ``dimensions`` / ``outputDimensionality``,
else :data:`EMBEDDING_DIMENSIONS`; ``Fault(dimensions=n)`` answers length ``n``
instead (a wrong-length upstream). They share the vendor's fault queue.

Every request is recorded (:attr:`FakeUpstream.requests`: method, path, query, headers,
body), and so is every stream the client closed before its end
(:attr:`FakeUpstream.disconnects`). Faults are scripted per vendor as a FIFO queue
(:meth:`FakeUpstream.script`); a request with nothing scripted gets a healthy answer.
Fault builders live in :class:`Faults` and produce each vendor's documented error body.

Streaming faults (issue 5) are scripted with :meth:`Faults.stream` (a
:class:`StreamScript`): the answer's text, a delay before the first text chunk, a
pause between chunks, a cut / stall / in-band error after N text chunks, one malformed
event, or no end marker (``[DONE]`` / ``message_stop``) after the finish reason.

Tool calls (issue 10), in each vendor's wire format, non-stream and stream: a request
that offers tools (and does not turn them off with its tool choice) and whose last
turn is not a tool result is answered with one call of the forced tool, else the first
one, its arguments made from the tool's parameter schema; any other request gets a
text answer — so a tool round trip (call → result → final answer) works unscripted.
``Fault(tool_calls=[{"name", "arguments", "id"?}, …])`` scripts the calls instead
(``[]``: answer text). Streamed, each call is its start frame followed by its
arguments in 8-character fragments (Gemini: one whole ``functionCall`` part per
event); each of those frames counts as a chunk for ``cut_after`` & co., so
``cut_after=2`` cuts a call in the middle of its arguments.
"""

from __future__ import annotations

import array
import base64
import hashlib
import json
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from llm_routing.providers.mock import instance_from_schema

__all__ = [
    "EMBEDDING_DIMENSIONS",
    "FakeUpstream",
    "Fault",
    "Faults",
    "RecordedRequest",
    "StreamScript",
    "fake_vector",
]

VENDORS = ("openai", "anthropic", "gemini")
#: The length of the fake's vectors when the request names none.
EMBEDDING_DIMENSIONS = 8


@dataclass(frozen=True)
class RecordedRequest:
    vendor: str
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    #: The client's (host, port): which process sent it (tests/test_asgi_server_services.py).
    client: tuple[str, int] | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass(frozen=True)
class StreamScript:
    """How one streamed answer goes (all counts are text chunks, one word each).

    ``text``: the answer (None → the default fake answer). ``first_chunk_delay``: the
    headers (and Anthropic's ``message_start``) go out at once, the first text chunk
    after this many seconds. ``interval``: seconds between text chunks.
    ``cut_after``: close the connection cleanly after N chunks (``reset=True``: a TCP
    RST instead). ``stall_after``: after N chunks, send nothing more for ``stall_s``
    seconds, then close. ``error_after``: after N chunks, the vendor's in-band error
    event (``error_status``: 529 overloaded / 503 unavailable …). ``malformed_at``:
    one unparsable event before chunk N. ``no_end_marker``: finish reason and usage,
    then the body ends without ``[DONE]`` / ``message_stop``.
    """

    text: str | None = None
    first_chunk_delay: float = 0.0
    interval: float = 0.0
    cut_after: int | None = None
    reset: bool = False
    stall_after: int | None = None
    stall_s: float = 10.0
    error_after: int | None = None
    error_status: int = 529
    malformed_at: int | None = None
    no_end_marker: bool = False
    #: OpenAI only: the (prompt, completion) tokens its usage chunk reports, instead of
    #: 11 and a completion token per chunk (an absurd count: tests/test_budgets_usage.py).
    usage: tuple[int, int] | None = None
    #: During ``first_chunk_delay``, watch the connection: a client that closes it is
    #: counted in :attr:`FakeUpstream.disconnects` at once (a cancelled hedge).
    watch: bool = False


@dataclass(frozen=True)
class Fault:
    """What to do with one request.

    ``action``: ``respond`` (``status``/``headers``/``body``; ``body=None`` → the
    vendor's healthy answer), ``reset`` (TCP RST before any header), ``hang`` (accept,
    read, never answer), ``close`` (close the socket cleanly before any header).
    ``delay`` waits before the first byte; with ``watch``, it watches the connection
    meanwhile — a client that closes it gets no answer and is counted in
    :attr:`FakeUpstream.disconnects` (a cancelled non-stream call). ``echo_key``
    appends the key the request carried to the error message (the way some vendors
    echo a bad key).
    """

    action: str = "respond"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # dict → JSON; bytes → raw; None → healthy answer
    delay: float = 0.0
    echo_key: bool = False
    stream: StreamScript | None = None  # how a streamed answer goes (body must be None)
    # The tool calls to answer (None: decided from the request; see the module doc).
    tool_calls: tuple[dict[str, Any], ...] | list[dict[str, Any]] | None = None
    # An embeddings answer's vector length (None: as the request asks, else 8).
    dimensions: int | None = None
    watch: bool = False  # during ``delay``: count a client that closes the connection


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
    def stream(*, echo_key: bool = False, **kwargs: Any) -> Fault:
        """A streamed answer shaped by :class:`StreamScript` (``Faults.stream(cut_after=2)``);
        ``echo_key``: an in-band error event echoes the request's key."""
        return Fault(stream=StreamScript(**kwargs), echo_key=echo_key)

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
    def slow(delay: float, *, watch: bool = False) -> Fault:
        return Fault(delay=delay, watch=watch)


# --- healthy answers ------------------------------------------------------------------
def _answer_text(body: Any) -> str:
    return f"fake answer ({len(json.dumps(body))} bytes of request)"


ToolCalls = list[dict[str, Any]]
ARGUMENT_FRAGMENT = 8  # characters of arguments per streamed tool-call fragment


def _tool_calls(vendor: str, body: Any, scripted: Any) -> ToolCalls:
    """The calls to answer: the scripted ones, else one of the offered tools unless the
    tool choice says none or the last turn is a tool result (see the module doc)."""
    if scripted is not None:
        return [
            {
                "id": c.get("id", f"{_ID_PREFIX[vendor]}_{i}"),
                "name": c["name"],
                "arguments": c.get("arguments", {}),
                "explicit_id": "id" in c,
            }
            for i, c in enumerate(scripted)
        ]
    if not isinstance(body, dict):
        return []
    offered: list[tuple[str, Any]] = []
    forced: str | None = None
    last: Any = None
    if vendor == "openai":
        offered = [
            (t["function"]["name"], t["function"].get("parameters"))
            for t in body.get("tools") or []
        ]
        choice = body.get("tool_choice")
        if choice == "none":
            return []
        if isinstance(choice, dict):
            forced = choice["function"]["name"]
        last = (body.get("messages") or [{}])[-1]
        if last.get("role") == "tool":
            return []
    elif vendor == "anthropic":
        offered = [
            (t["name"], t.get("input_schema"))
            for t in body.get("tools") or []
            if t["name"] != "structured_output"
        ]
        choice = body.get("tool_choice") or {}
        if choice.get("type") == "none" or choice.get("name") == "structured_output":
            return []
        forced = choice.get("name")
        last = (body.get("messages") or [{}])[-1]
        content = last.get("content")
        if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
            return []
    else:
        offered = [
            (d["name"], d.get("parameters"))
            for t in body.get("tools") or []
            for d in t.get("functionDeclarations") or []
        ]
        config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
        if config.get("mode") == "NONE":
            return []
        forced = (config.get("allowedFunctionNames") or [None])[0]
        last = (body.get("contents") or [{}])[-1]
        if any("functionResponse" in part for part in last.get("parts") or []):
            return []
    if not offered:
        return []
    schemas = dict(offered)
    name = forced if forced in schemas else offered[0][0]
    arguments = instance_from_schema(schemas[name] or {})
    return [
        {
            "id": f"{_ID_PREFIX[vendor]}_0",
            "name": name,
            "arguments": arguments if isinstance(arguments, dict) else {},
            "explicit_id": False,
        }
    ]


_ID_PREFIX = {"openai": "call_fake", "anthropic": "toolu_fake", "gemini": "fc_fake"}


def _gemini_call(call: dict[str, Any]) -> dict[str, Any]:
    """Gemini's functionCall part (the id only when scripted: Gemini often omits it)."""
    function: dict[str, Any] = {"name": call["name"], "args": _arguments_value(call["arguments"])}
    if call["explicit_id"]:
        function["id"] = call["id"]
    return {"functionCall": function}


class JSONText(str):
    """Scripted tool-call ``arguments`` sent exactly as written (an upstream may spell
    its JSON with ``\\u`` escapes); any other value goes out as ``json.dumps`` writes it."""


def _arguments_text(arguments: Any) -> str:
    return str(arguments) if isinstance(arguments, JSONText) else json.dumps(arguments)


def _arguments_value(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, JSONText) else arguments


def _fragments(arguments: Any) -> list[str]:
    text = _arguments_text(arguments)
    return [text[i : i + ARGUMENT_FRAGMENT] for i in range(0, len(text), ARGUMENT_FRAGMENT)]


def fake_vector(text: str, dimensions: int) -> list[float]:
    """The fake's deterministic vector of ``text`` (values in -1 … 1)."""
    out: list[float] = []
    counter = 0
    while len(out) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        out += [(b - 127.5) / 127.5 for b in digest]
        counter += 1
    return out[:dimensions]


def _embedding_texts(body: Any) -> list[str]:
    if isinstance(body, dict) and isinstance(body.get("requests"), list):  # Gemini batch
        return [r["content"]["parts"][0]["text"] for r in body["requests"]]
    if isinstance(body, dict) and isinstance(body.get("content"), dict):  # Gemini single
        return [body["content"]["parts"][0]["text"]]
    raw = body.get("input") if isinstance(body, dict) else None
    items = raw if isinstance(raw, list) else [raw]
    if items and all(isinstance(x, int) for x in items):
        items = [items]
    return [x if isinstance(x, str) else json.dumps(x) for x in items]


def _embeddings_ok(vendor: str, body: Any, fault: Fault) -> dict[str, Any]:
    texts = _embedding_texts(body)
    if vendor == "gemini":
        asked = (body.get("requests") or [body])[0].get("outputDimensionality")
    else:
        asked = body.get("dimensions")
    size = fault.dimensions or asked or EMBEDDING_DIMENSIONS
    vectors = [fake_vector(t, size) for t in texts]
    if vendor == "gemini":
        if "requests" in body:
            return {"embeddings": [{"values": v} for v in vectors]}
        return {"embedding": {"values": vectors[0]}}
    as_base64 = body.get("encoding_format") == "base64"
    tokens = sum(len(t.split()) for t in texts)
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(array.array("f", v).tobytes()).decode()
                if as_base64
                else v,
            }
            for i, v in enumerate(vectors)
        ],
        "model": body.get("model"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _openai_ok(body: dict[str, Any], calls: ToolCalls | None = None) -> dict[str, Any]:
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    content = json.dumps(instance_from_schema(schema)) if schema else _answer_text(body)
    if calls:
        return {
            **_openai_ok(body),
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "tool_calls": [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {
                                    "name": c["name"],
                                    "arguments": _arguments_text(c["arguments"]),
                                },
                            }
                            for c in calls
                        ],
                    },
                    "logprobs": None,
                    "finish_reason": "tool_calls",
                }
            ],
        }
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


def _anthropic_ok(body: dict[str, Any], calls: ToolCalls | None = None) -> dict[str, Any]:
    tools = [t for t in body.get("tools") or [] if t["name"] == "structured_output"]
    if calls:
        content: list[dict[str, Any]] = [
            {
                "type": "tool_use",
                "id": c["id"],
                "name": c["name"],
                "input": _arguments_value(c["arguments"]),
            }
            for c in calls
        ]
        stop = "tool_use"
    elif tools:
        content = [
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


def _gemini_ok(body: dict[str, Any], model: str, calls: ToolCalls | None = None) -> dict[str, Any]:
    config = body.get("generationConfig") or {}
    schema = config.get("responseSchema")
    text = json.dumps(instance_from_schema(schema)) if schema else _answer_text(body)
    parts = [_gemini_call(c) for c in calls] if calls else [{"text": text}]
    return {
        "candidates": [
            {
                "content": {"parts": parts, "role": "model"},
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


def _stream_error_body(vendor: str, status: int) -> dict[str, Any]:
    if vendor == "anthropic":
        if status == 529:
            return {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
    if vendor == "gemini":
        return {
            "error": {
                "code": status,
                "message": "The model is overloaded.",
                "status": "UNAVAILABLE",
            }
        }
    return {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


@dataclass
class _Frames:
    """One streamed answer: frames before the text, one frame per text chunk, frames
    after (finish reason, usage), the end marker (may be empty), an in-band error."""

    head: list[bytes]
    texts: list[bytes]
    tail: list[bytes]
    end: list[bytes]
    error: bytes
    malformed: bytes


def _sse_frames(
    vendor: str,
    body: dict[str, Any],
    model: str,
    script: StreamScript,
    echo_key: str = "",
    calls: ToolCalls | None = None,
) -> _Frames:
    text = script.text if script.text is not None else _answer_text(body)
    structured_tool = [t for t in body.get("tools") or [] if t.get("name") == "structured_output"]
    schema = (
        ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
        or (structured_tool[0].get("input_schema") if structured_tool else None)
        or (body.get("generationConfig") or {}).get("responseSchema")
    )
    if schema and script.text is None:  # structured output, streamed in pieces
        text = json.dumps(instance_from_schema(schema))
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]

    def data(obj: Any, sep: bytes = b"\n\n") -> bytes:
        return b"data: " + json.dumps(obj).encode() + sep

    def event(name: str, obj: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()

    error = _stream_error_body(vendor, script.error_status)
    if echo_key:  # the in-band error echoes the key the request carried
        error["error"]["message"] += f" {echo_key}"
    if vendor == "openai":
        requested = body.get("model")

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            return data(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 1_700_000_000,
                    "model": f"{requested}-2024-fake",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        call_frames = [
            frame
            for i, c in enumerate(calls or [])
            for frame in [
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": c["id"],
                                "type": "function",
                                "function": {"name": c["name"], "arguments": ""},
                            }
                        ]
                    },
                    None,
                ),
                *(
                    chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}, None)
                    for f in _fragments(c["arguments"])
                ),
            ]
        ]
        count = len(call_frames) if calls else len(pieces)
        tail = [chunk({}, "tool_calls" if calls else "stop")]
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt, completion = script.usage or (11, count)
            tail.append(
                data(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "model": f"{requested}-2024-fake",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        },
                    }
                )
            )
        return _Frames(
            head=[chunk({"role": "assistant", "content": None if calls else ""}, None)],
            texts=call_frames if calls else [chunk({"content": p}, None) for p in pieces],
            tail=tail,
            end=[b"data: [DONE]\n\n"],
            error=data(error),
            malformed=b'data: {"choices": [{"index": 0, "delta": {"content": \n\n',
        )
    if vendor == "anthropic":
        start = {**_anthropic_ok(body), "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": 12, "output_tokens": 1}
        if calls:
            call_frames = [
                frame
                for i, c in enumerate(calls)
                for frame in [
                    event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {
                                "type": "tool_use",
                                "id": c["id"],
                                "name": c["name"],
                                "input": {},
                            },
                        },
                    ),
                    *(
                        event(
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "input_json_delta", "partial_json": f},
                            },
                        )
                        for f in _fragments(c["arguments"])
                    ),
                    event("content_block_stop", {"type": "content_block_stop", "index": i}),
                ]
            ]
            return _Frames(
                head=[
                    event("message_start", {"type": "message_start", "message": start}),
                    event("ping", {"type": "ping"}),
                ],
                texts=call_frames,
                tail=[
                    event(
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                            "usage": {"output_tokens": len(call_frames)},
                        },
                    )
                ],
                end=[event("message_stop", {"type": "message_stop"})],
                error=event("error", error),
                malformed=b"event: content_block_delta\ndata: {not json\n\n",
            )
        if structured_tool:
            block = {
                "type": "tool_use",
                "id": "toolu_fake",
                "name": "structured_output",
                "input": {},
            }
            delta_type, key, stop = "input_json_delta", "partial_json", "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta_type, key, stop = "text_delta", "text", "end_turn"
        return _Frames(
            head=[
                event("message_start", {"type": "message_start", "message": start}),
                event(
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ),
                event("ping", {"type": "ping"}),
            ],
            texts=[
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": delta_type, key: p},
                    },
                )
                for p in pieces
            ],
            tail=[
                event("content_block_stop", {"type": "content_block_stop", "index": 0}),
                event(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": len(pieces)},
                    },
                ),
            ],
            end=[event("message_stop", {"type": "message_stop"})],
            error=event("error", error),
            malformed=b"event: content_block_delta\ndata: {not json\n\n",
        )

    # Gemini: every event a whole GenerateContentResponse; no end marker.
    def response(part: str | dict[str, Any], finish: str | None, usage: bool) -> bytes:
        candidate: dict[str, Any] = {
            "content": {
                "parts": [part if isinstance(part, dict) else {"text": part}],
                "role": "model",
            },
            "index": 0,
        }
        if finish:
            candidate["finishReason"] = finish
        obj: dict[str, Any] = {
            "candidates": [candidate],
            "modelVersion": f"{model}-fake",
            "responseId": "fake-response",
        }
        if usage:
            obj["usageMetadata"] = {
                "promptTokenCount": 13,
                "candidatesTokenCount": len(pieces),
                "totalTokenCount": 13 + len(pieces),
            }
        return data(obj, b"\r\n\r\n")

    if calls:
        return _Frames(
            head=[],
            texts=[response(_gemini_call(c), None, False) for c in calls],
            tail=[response("", "STOP", True)],
            end=[],
            error=data(error, b"\r\n\r\n"),
            malformed=b'data: {"candidates": [{"content": \r\n\r\n',
        )
    return _Frames(
        head=[],
        texts=[response(p, None, False) for p in pieces],
        tail=[response("", "STOP", True)],
        end=[],
        error=data(error, b"\r\n\r\n"),
        malformed=b'data: {"candidates": [{"content": \r\n\r\n',
    )


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
            RecordedRequest(
                vendor or "unknown",
                "POST",
                split.path,
                split.query,
                headers,
                body,
                client=(str(self.client_address[0]), int(self.client_address[1])),
            )
        )
        if vendor is None:
            self._send(404, {"error": {"message": f"No route for {split.path}"}})
            return
        fault = fake._next_fault(vendor)
        if fault.delay and fault.watch:
            if self._client_left(fault.delay):
                return
        elif fault.delay:
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
        if fault.body is None and split.path.endswith(
            ("/embeddings", ":embedContent", ":batchEmbedContents")
        ):
            self._send(fault.status, _embeddings_ok(vendor, request_json, fault), fault.headers)
            return
        if fault.body is None:
            calls = _tool_calls(vendor, request_json, fault.tool_calls)
            if streaming or (isinstance(request_json, dict) and request_json.get("stream")):
                echo = self._echo_key({}, headers)["error"]["message"] if fault.echo_key else ""
                self._stream(vendor, request_json, model, fault.stream, echo, calls)
                return
            answer = {
                "openai": lambda: _openai_ok(request_json, calls),
                "anthropic": lambda: _anthropic_ok(request_json, calls),
                "gemini": lambda: _gemini_ok(request_json, model, calls),
            }[vendor]()
            self._send(fault.status, answer, fault.headers)
            return
        payload = fault.body
        if fault.echo_key and isinstance(payload, dict):
            payload = self._echo_key(payload, headers)
        self._send(fault.status, payload, fault.headers)

    # --- helpers --------------------------------------------------------------------
    def _client_left(self, delay: float) -> bool:
        """Wait ``delay`` seconds watching the connection; True (counted as a
        disconnect) when the client closed it meanwhile."""
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.02))
            if not readable:
                continue
            try:
                data = self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                data = b""
            if not data:
                self.close_connection = True
                self.server.fake._disconnected()
                return True
            time.sleep(min(left, 0.02))  # a pipelined byte: not a close
        return False

    @staticmethod
    def _route(path: str) -> tuple[str | None, str, bool]:
        if path.endswith(("/chat/completions", "/embeddings")):
            return "openai", "", False
        if path.endswith("/v1/messages"):
            return "anthropic", "", False
        if "/models/" in path and ":" in path.rsplit("/", 1)[-1]:
            model, method = path.rsplit("/", 1)[-1].split(":", 1)
            if method == "generateContent":
                return "gemini", model, False
            if method == "streamGenerateContent":
                return "gemini", model, True
            if method in ("embedContent", "batchEmbedContents"):
                return "gemini", model, False
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

    def _stream(
        self,
        vendor: str,
        body: dict[str, Any],
        model: str,
        script: StreamScript | None,
        echo_key: str = "",
        calls: ToolCalls | None = None,
    ) -> None:
        script = script or StreamScript()
        frames = _sse_frames(vendor, body, model, script, echo_key, calls)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self._write(*frames.head)
            for index, frame in enumerate([*frames.texts, None]):
                if index == 0 and script.first_chunk_delay:
                    if script.watch:
                        if self._client_left(script.first_chunk_delay):
                            return
                    elif self.server.fake._release.wait(script.first_chunk_delay):
                        return
                if script.malformed_at == index:
                    self._write(frames.malformed)
                if script.cut_after == index:
                    if script.reset:
                        self._reset()
                    else:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if script.stall_after == index:
                    self.server.fake._release.wait(script.stall_s)
                    return
                if script.error_after == index:
                    self._write(frames.error)
                    return
                if frame is None:
                    break
                if index and script.interval:
                    time.sleep(script.interval)
                self._write(frame)
            self._write(*frames.tail)
            if not script.no_end_marker:
                self._write(*frames.end)
        except OSError:  # the client went away (e.g. it gave up on a stall)
            self.server.fake._disconnected()
            return

    def _write(self, *frames: bytes) -> None:
        for frame in frames:
            self.wfile.write(frame)
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
    # socketserver's default listen backlog is 5: a burst of concurrent streams (bench/)
    # would see dropped SYNs and 1 s retransmits.
    request_queue_size = 256
    fake: FakeUpstream


class FakeUpstream:
    """Start with :meth:`start`, stop with :meth:`stop` (the pytest fixture does both)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        #: Streams the client closed before their end (a write found the connection gone).
        self.disconnects = 0
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

    def _disconnected(self) -> None:
        with self._lock:
            self.disconnects += 1

    def requests_for(self, vendor: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.vendor == vendor]

    def pending(self, vendor: str) -> int:
        with self._lock:
            return len(self._queues[vendor])
