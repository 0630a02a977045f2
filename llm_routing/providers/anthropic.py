"""Anthropic Messages API (``POST {base_url}/v1/messages``).

Request: headers ``x-api-key`` and ``anthropic-version: 2023-06-01``; body
``{"model", "max_tokens", "system"?, "messages", …params}`` (``max_tokens`` is required
by the API: ``params["max_tokens"]`` or 1024).

The conversation: every ``system`` and ``developer`` turn goes to ``system`` (their
texts joined by a blank line, in order); user and assistant turns keep their order;
image parts become ``image`` blocks (``source`` ``base64`` for a ``data:`` URL, ``url``
for http(s)); an assistant turn's tool calls become ``tool_use`` blocks (``input`` is
the parsed JSON arguments — arguments that are not a JSON object are the caller's
invalid request); ``tool`` turns become ``tool_result`` blocks of one user turn
(consecutive results, and a user turn right after them, share that turn, as the API
requires). ``tools`` → ``[{name, description, input_schema}]``; ``tool_choice``
auto / required / none / a named function → ``{"type": "auto"}`` / ``{"type": "any"}``
/ ``{"type": "none"}`` / ``{"type": "tool", "name"}``; ``stop`` → ``stop_sequences``;
``top_p``; ``user`` → ``metadata.user_id``. ``seed`` has no Anthropic equivalent and
is dropped.

Structured output: one tool whose ``input_schema`` is the request's schema, forced with
``tool_choice: {"type": "tool", "name": "structured_output"}``; the answer is that
``tool_use`` block's ``input``. With ``tools`` as well, both are sent and the model
must call one of them (``{"type": "any"}``; a named tool choice still names its tool;
``none`` forces the structured answer): a call of one of the request's tools is a
tool-call answer, a ``structured_output`` call the structured final answer. A request
tool named ``structured_output`` then collides and is an invalid request.
Response: ``content`` blocks (``text`` / ``tool_use``: the request's tools' calls
become ``result.tool_calls``, ``arguments`` the compact JSON of ``input``),
``stop_reason`` (``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``,
``refusal``; kept as sent), ``usage.input_tokens`` / ``usage.output_tokens``, ``model``.
Errors: ``{"type": "error", "error": {"type", "message"}, "request_id"}`` — types
``invalid_request_error`` (400; "prompt is too long" means context length),
``authentication_error`` (401), ``permission_error`` (403), ``not_found_error`` (404),
``request_too_large`` (413), ``rate_limit_error`` (429), ``api_error`` (500),
``overloaded_error`` (529).

Streaming (``"stream": true``): named SSE events ``message_start`` (model, input
usage), ``content_block_start`` / ``content_block_delta`` (``text_delta``; for the
structured-output tool, ``input_json_delta`` pieces of its JSON input, streamed as the
answer text and validated once complete; for a ``tool_use`` block of the request's
tools, a tool-call start with its id and name, then its ``input_json_delta`` pieces as
argument fragments) / ``content_block_stop``, ``message_delta``
(``stop_reason``, cumulative output usage), ``message_stop``, any number of ``ping``,
and ``error`` (e.g. ``overloaded_error``) — unknown event types are ignored, as the
API's versioning policy asks.

Pass-through: the request's ``temperature`` and ``max_tokens`` override the row's
params. A continuation ``prefill`` is Anthropic's native prefill: a trailing assistant
message. The API rejects a final assistant message ending in whitespace, so trailing
whitespace is cut from the prefill and dropped again from the start of the
continuation.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, InvalidRequestError, ResponseError
from ..types import AuditRequest, ContentPart, ForcedTool, Message, ProviderResult, ToolCall
from .base import HttpProvider, validate_structured
from .chat import arguments_object, compact_json, data_url, split_system
from .classify import classify_http_error
from .streaming import MalformedEvent, StreamDecoder, StreamItem

__all__ = [
    "ANTHROPIC_VERSION",
    "STRUCTURED_TOOL_NAME",
    "AnthropicProvider",
    "MessagesStreamDecoder",
    "anthropic_messages",
]

ANTHROPIC_VERSION = "2023-06-01"
STRUCTURED_TOOL_NAME = "structured_output"
DEFAULT_MAX_TOKENS = 1024
_RESERVED = frozenset({"model", "messages", "system", "stream", "tools", "tool_choice"})
_TOOL_CHOICE = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}


def anthropic_messages(turns: list[Message]) -> list[dict[str, Any]]:
    """User, assistant and tool turns as Messages API ``messages``."""
    out: list[dict[str, Any]] = []
    results_open = False  # the last user turn carries tool_result blocks
    for message in turns:
        if message.role == "tool":
            if not message.tool_call_id:
                raise InvalidRequestError("A tool message needs the tool_call_id it answers.")
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": (
                    message.content
                    if isinstance(message.content, str)
                    else _blocks(message.content)
                ),
            }
            if results_open:
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
                results_open = True
            continue
        if message.role == "assistant":
            content: Any = message.content
            if message.tool_calls:
                content = (
                    _blocks(content)
                    if not isinstance(content, str)
                    else ([{"type": "text", "text": content}] if content else [])
                )
                content.extend(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": arguments_object(call),
                    }
                    for call in message.tool_calls
                )
            elif not isinstance(content, str):
                content = _blocks(content)
            out.append({"role": "assistant", "content": content})
        elif results_open:  # a user turn right after tool results joins their turn
            content = message.content
            out[-1]["content"].extend(
                [{"type": "text", "text": content}]
                if isinstance(content, str)
                else _blocks(content)
            )
        else:
            content = message.content
            out.append(
                {
                    "role": "user",
                    "content": content if isinstance(content, str) else _blocks(content),
                }
            )
        results_open = False
    return out


def _blocks(parts: tuple[ContentPart, ...]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if part.type == "text":
            blocks.append({"type": "text", "text": part.text})
            continue
        inline = data_url(part.image_url)
        if inline is not None:
            source = {"type": "base64", "media_type": inline[0], "data": inline[1]}
        elif part.image_url.startswith(("https://", "http://")):
            source = {"type": "url", "url": part.image_url}
        else:
            raise InvalidRequestError("An image URL must be http(s) or a base64 data: URL.")
        blocks.append({"type": "image", "source": source})
    return blocks


def _tool_choice(request: AuditRequest) -> dict[str, Any] | None:
    choice = request.tool_choice
    if request.response_schema is not None:
        if isinstance(choice, ForcedTool):
            return {"type": "tool", "name": choice.name}
        if request.tools and choice != "none":
            return {"type": "any"}
        return {"type": "tool", "name": STRUCTURED_TOOL_NAME}
    if choice is None:
        return None
    if isinstance(choice, ForcedTool):
        return {"type": "tool", "name": choice.name}
    return dict(_TOOL_CHOICE[choice])


class MessagesStreamDecoder(StreamDecoder):
    """Anthropic Messages stream events."""

    def __init__(self, provider: AnthropicProvider, *, structured: bool, strip_prefix: str):
        super().__init__(strip_prefix=strip_prefix)
        self.provider = provider
        self.structured = structured
        self.tool_index: object = None

    def feed(self, event: ServerSentEvent) -> list[StreamItem]:
        if event.event == "ping":
            return []
        data = self.load(event)
        kind = data.get("type") or event.event
        if kind == "error" or event.event == "error":
            text, codes = self.provider.error_details(data)
            raise classify_http_error(
                200, message=text or "The provider's stream reported an error.", codes=codes
            )
        if kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict):
                raise MalformedEvent
            if isinstance(message.get("model"), str) and message["model"]:
                self.model = message["model"]
            usage = message.get("usage")
            if isinstance(usage, dict):
                self.tokens(
                    input_tokens=usage.get("input_tokens"),
                    output_tokens=usage.get("output_tokens"),
                )
            return []
        if kind == "content_block_start":
            block = data.get("content_block")
            if not isinstance(block, dict):
                raise MalformedEvent
            if (
                block.get("type") == "tool_use"
                and block.get("name") == STRUCTURED_TOOL_NAME
                and self.structured
            ):
                self.tool_index = data.get("index")
            elif block.get("type") == "tool_use":
                call_id, name = block.get("id"), block.get("name")
                if not isinstance(call_id, str | None) or not isinstance(name, str | None):
                    raise MalformedEvent
                return [self.start_tool_call(data.get("index"), id=call_id, name=name)]
            elif block.get("type") == "text" and not self.structured:
                initial = block.get("text")
                return self.emit([initial]) if isinstance(initial, str) and initial else []
            return []
        if kind == "content_block_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise MalformedEvent
            dtype = delta.get("type")
            if dtype == "text_delta" and not self.structured:
                piece = delta.get("text")
                if not isinstance(piece, str):
                    raise MalformedEvent
                return self.emit([piece])
            if dtype == "input_json_delta":
                index = data.get("index")
                structured = self.structured and index == self.tool_index
                if not structured and not self.has_tool_call(index):
                    return []
                partial = delta.get("partial_json")
                if not isinstance(partial, str):
                    raise MalformedEvent
                if structured:
                    return self.emit([partial])
                fragment = self.tool_arguments(index, partial)
                return [fragment] if fragment is not None else []
            return []  # thinking, signature, citations …
        if kind == "message_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise MalformedEvent
            stop = delta.get("stop_reason")
            if stop == "refusal":
                raise ContentPolicyError(
                    "The provider refused the request under its content policy.",
                    code="refusal",
                )
            if isinstance(stop, str) and stop:
                self.finish_reason = stop
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.tokens(
                    input_tokens=usage.get("input_tokens"),
                    output_tokens=usage.get("output_tokens"),
                )
            return []
        if kind == "message_stop":
            self.done = True
        return []


class AnthropicProvider(HttpProvider):
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images", "prefill"}
    )
    kind: ClassVar[str] = "anthropic"
    default_base_url: ClassVar[str] = "https://api.anthropic.com"

    def endpoint(self, request: AuditRequest) -> str:
        return f"{self.base_url}/v1/messages"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        if request.messages:
            system, turns = split_system(request.conversation)
            messages = anthropic_messages(turns)
        else:  # the one-shot form, built directly (the adapter's per-call cost)
            system = request.instructions
            messages = [{"role": "user", "content": request.input_text}]
        payload: dict[str, Any] = {
            "max_tokens": DEFAULT_MAX_TOKENS,
            **self.extra_params(_RESERVED),
            "model": self.config.model,
            "messages": messages,
        }
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.max_tokens is not None:
            payload["max_tokens"] = request.max_tokens
        if request.top_p is not None:
            payload["top_p"] = request.top_p
        if request.stop:
            payload["stop_sequences"] = list(request.stop)
        if request.user is not None:
            payload["metadata"] = {"user_id": request.user}
        prefill = request.prefill.rstrip()
        if prefill:
            payload["messages"].append({"role": "assistant", "content": prefill})
        if system:
            payload["system"] = system
        tools = [
            {
                "name": tool.name,
                **({"description": tool.description} if tool.description else {}),
                "input_schema": dict(tool.parameters) or {"type": "object", "properties": {}},
            }
            for tool in request.tools
        ]
        if request.response_schema is not None:
            if any(tool.name == STRUCTURED_TOOL_NAME for tool in request.tools):
                raise InvalidRequestError(
                    f"A tool named {STRUCTURED_TOOL_NAME!r} collides with structured output."
                )
            tools.append(
                {
                    "name": STRUCTURED_TOOL_NAME,
                    "description": "Return the answer as this JSON object.",
                    "input_schema": dict(request.response_schema),
                }
            )
        if tools:
            payload["tools"] = tools
        choice = _tool_choice(request)
        if choice is not None:
            payload["tool_choice"] = choice
        return payload

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder:
        prefill = request.prefill
        return MessagesStreamDecoder(
            self,
            structured=request.response_schema is not None,
            strip_prefix=prefill[len(prefill.rstrip()) :] if prefill.rstrip() else "",
        )

    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            message = error.get("message")
            details = error.get("details")
            extra = details.get("error_code") if isinstance(details, dict) else None
            return message if isinstance(message, str) else "", (error.get("type"), extra)
        return "", ()

    def raise_for_error_body(self, data: Any) -> None:
        if isinstance(data, dict) and data.get("type") == "error":
            message, codes = self.error_details(data)
            raise classify_http_error(
                200, message=message or "The provider answered 200 with an error.", codes=codes
            )
        super().raise_for_error_body(data)

    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise ResponseError("The response has no content list.")
        stop = data.get("stop_reason")
        if stop == "refusal":
            raise ContentPolicyError(
                "The provider refused the request under its content policy.", code="refusal"
            )
        texts = [
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        ]
        output = "".join(texts)
        tool_calls = _parse_tool_calls(content, structured=request.response_schema is not None)
        structured = None
        if request.response_schema is not None and not tool_calls:
            tool = next(
                (
                    b
                    for b in content
                    if isinstance(b, dict)
                    and b.get("type") == "tool_use"
                    and b.get("name") == STRUCTURED_TOOL_NAME
                ),
                None,
            )
            if tool is None or not isinstance(tool.get("input"), dict):
                raise ResponseError("The response has no structured_output tool_use block.")
            structured = validate_structured(tool["input"], request.response_schema)
            output = output or json.dumps(structured, ensure_ascii=False)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("model"),
            output=output,
            data=structured,
            input_tokens=usage.get("input_tokens", 0),
            output_tokens=usage.get("output_tokens", 0),
            finish_reason=stop,
            tool_calls=tool_calls,
        )


def _parse_tool_calls(content: list[Any], *, structured: bool) -> tuple[ToolCall, ...]:
    """``tool_use`` blocks of the request's tools (not the structured-output tool)."""
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        name = block.get("name")
        if structured and name == STRUCTURED_TOOL_NAME:
            continue
        call_id = block.get("id")
        if not isinstance(name, str) or not name or not isinstance(call_id, str):
            raise ResponseError("A tool_use block has no id or name.")
        arguments = block.get("input")
        calls.append(
            ToolCall(
                id=call_id,
                name=name,
                arguments=compact_json({} if arguments is None else arguments),
            )
        )
    return tuple(calls)
