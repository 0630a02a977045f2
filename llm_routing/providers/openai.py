"""OpenAI Chat Completions (``POST {base_url}/chat/completions``).

Request: ``Authorization: Bearer <key>``; body ``{"model", "messages", …params}``.
``messages`` is the request's conversation in OpenAI's own shape (roles ``system``,
``developer``, ``user``, ``assistant``, ``tool``; content a string or ``text`` /
``image_url`` parts; assistant ``tool_calls``; ``tool_call_id`` on tool turns; an
assistant turn with tool calls and no text sends ``content: null``). The request's
``tools``, ``tool_choice``, ``stop``, ``top_p``, ``seed`` and ``user`` are sent under
their own names and override the row's ``params``. Structured output through
``response_format`` ``{"type": "json_schema", "json_schema": {"name", "schema",
"strict": true}}``.
Response: ``choices[0].message.content`` (or ``.refusal``), ``.tool_calls``
(``[{id, type: "function", function: {name, arguments}}]``, normalized into
``result.tool_calls``), ``choices[0].finish_reason`` (kept as sent: ``tool_calls``),
``usage.prompt_tokens`` / ``usage.completion_tokens``, ``model``.
Errors: ``{"error": {"message", "type", "param", "code"}}`` — ``code`` such as
``context_length_exceeded``, ``invalid_api_key``, ``rate_limit_exceeded``,
``insufficient_quota``, ``content_policy_violation``.

Streaming: ``"stream": true`` and ``stream_options: {"include_usage": true}`` (a row
may send ``params {"stream_include_usage": false}`` for servers that reject it);
``data:`` events carry ``chat.completion.chunk`` objects (``choices[0].delta.content``,
``choices[0].delta.tool_calls`` fragments — the first of each ``index`` with ``id`` and
``function.name``, later ones pieces of ``function.arguments`` — and
``choices[0].finish_reason``), then a usage chunk with empty ``choices``, then
``data: [DONE]``. A mid-stream failure is an in-band ``data: {"error": {…}}`` event.

Pass-through: the request's ``temperature`` and ``max_tokens`` (the OpenAI-compatible
face) override the row's ``params``; ``max_tokens`` is sent under the key the row's
params use (``max_tokens`` or ``max_completion_tokens``), else under
:attr:`OpenAIProvider.max_tokens_key`. A continuation ``prefill`` is sent as a
trailing assistant message.

Embeddings: ``POST {base_url}/embeddings`` with ``{"model", "input": [texts] or [[token
ids]], "encoding_format": "base64", "dimensions"?, "user"?}`` — base64 asked for and
decoded, as the official client does (a server that answers JSON numbers anyway is
read as well); ``dimensions`` is the client's, else the row's ``params.dimensions``
(the only row param sent: chat params such as ``temperature`` are not). Response:
``data[i].embedding`` by ``data[i].index``, ``usage.prompt_tokens``, ``model``.

``openai_compatible`` differs in one place: a ``developer`` turn is sent as ``system``
(vLLM, Ollama, llama.cpp and LM Studio reject or ignore the newer role; see
:attr:`OpenAIProvider.developer_role`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ForcedTool, Message, ProviderResult, ToolCall
from .base import HttpProvider, validate_structured
from .chat import compact_json
from .embeddings import vector_of
from .streaming import MalformedEvent, StreamDecoder, StreamItem

__all__ = [
    "ChatCompletionChunkDecoder",
    "OpenAIProvider",
    "chat_messages",
    "schema_name",
    "tool_choice_value",
]

_RESERVED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "response_format",
        "n",
        "strict_schema",
        "stream_include_usage",
        "tools",
        "tool_choice",
    }
)
_NAME_RE = re.compile(r"[^a-zA-Z0-9_-]+")


def chat_messages(request: AuditRequest, *, developer_role: str = "developer") -> list[Any]:
    """The conversation in OpenAI's ``messages`` shape (plus a trailing assistant
    prefill); ``developer`` turns are sent with role ``developer_role``."""
    if request.messages:
        messages: list[Any] = [_chat_message(m, developer_role) for m in request.conversation]
    else:  # the one-shot form, built directly (the adapter's per-call cost)
        messages = (
            [{"role": "system", "content": request.instructions}] if request.instructions else []
        )
        messages.append({"role": "user", "content": request.input_text})
    if request.prefill:
        messages.append({"role": "assistant", "content": request.prefill})
    return messages


def _chat_message(message: Message, developer_role: str) -> dict[str, Any]:
    if isinstance(message.content, str) and not message.tool_calls and message.name is None:
        # The common case, built directly (the adapter's per-call cost).
        out: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
    else:
        out = message.to_dict()
        if message.tool_calls and not message.content:
            out["content"] = None  # what OpenAI itself returns for a tool-call turn
        if message.role == "tool":
            out.pop("name", None)  # a tool turn is matched by tool_call_id; no name field
    if message.role == "developer":
        out["role"] = developer_role
    return out


def tool_choice_value(choice: str | ForcedTool) -> Any:
    if isinstance(choice, ForcedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def schema_name(schema: Any) -> str:
    """A ``json_schema.name``: the schema's title made safe (a-z, 0-9, _ and -; ≤ 64)."""
    title = schema.get("title") if isinstance(schema, dict) else None
    name = _NAME_RE.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "response"


class ChatCompletionChunkDecoder(StreamDecoder):
    """``chat.completion.chunk`` events, the usage chunk and ``[DONE]``."""

    def __init__(self, provider: OpenAIProvider) -> None:
        super().__init__()
        self.provider = provider
        self._last_key: object = None  # the key of the last tool-call fragment

    def feed(self, event: ServerSentEvent) -> list[StreamItem]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        data = self.load(event)
        self.provider.raise_for_error_body(data)
        if isinstance(data.get("model"), str) and data["model"]:
            self.model = data["model"]
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.tokens(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
            )
        choices = data.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise MalformedEvent
        items: list[StreamItem] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedEvent
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedEvent
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                raise MalformedEvent
            finish = choice.get("finish_reason")
            if finish == "content_filter" or delta.get("refusal"):
                raise ContentPolicyError(
                    "The provider refused the request under its content policy.",
                    code="content_filter",
                )
            if content:
                items.extend(self.emit([content]))
            calls = delta.get("tool_calls")
            if calls is not None:
                items.extend(self._tool_fragments(calls))
            if finish:
                self.finish_reason = str(finish)
        return items

    def _tool_fragments(self, calls: object) -> list[StreamItem]:
        if not isinstance(calls, list):
            raise MalformedEvent
        items: list[StreamItem] = []
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                raise MalformedEvent
            function = call.get("function") or {}
            if not isinstance(function, dict):
                raise MalformedEvent
            call_id, name = call.get("id"), function.get("name")
            arguments = function.get("arguments")
            if not (
                isinstance(call_id, str | None)
                and isinstance(name, str | None)
                and isinstance(arguments, str | None)
            ):
                raise MalformedEvent
            key: object = call.get("index")
            if key is None:
                # Some compatible servers leave out ``index``: a new id is a new call,
                # a fragment without one continues the last call.
                key = ("id", call_id) if call_id else self._last_key
                key = key if key is not None else position
            elif not isinstance(key, int):
                raise MalformedEvent
            self._last_key = key
            items.extend(self.tool_call_items(key, id=call_id, name=name, arguments=arguments))
        return items


class OpenAIProvider(HttpProvider):
    kind: ClassVar[str] = "openai"
    default_base_url: ClassVar[str] = "https://api.openai.com/v1"
    usage_keys: ClassVar[tuple[str, str, str]] = ("usage", "prompt_tokens", "completion_tokens")
    #: Where a pass-through ``max_tokens`` goes when the row's params name neither key.
    max_tokens_key: ClassVar[str] = "max_completion_tokens"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images", "embeddings", "token_inputs"}
    )
    #: The role a ``developer`` turn is sent with.
    developer_role: ClassVar[str] = "developer"

    def endpoint(self, request: AuditRequest) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            **self.extra_params(_RESERVED),
            "model": self.config.model,
            "messages": chat_messages(request, developer_role=self.developer_role),
        }
        if request.tools:
            payload["tools"] = [tool.to_dict() for tool in request.tools]
        if request.tool_choice is not None:
            payload["tool_choice"] = tool_choice_value(request.tool_choice)
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.top_p is not None:
            payload["top_p"] = request.top_p
        if request.stop:
            payload["stop"] = list(request.stop)
        if request.seed is not None:
            payload["seed"] = request.seed
        if request.user is not None:
            payload["user"] = request.user
        if request.max_tokens is not None:
            params = self.config.params or {}
            key = next(
                (k for k in ("max_completion_tokens", "max_tokens") if k in params),
                self.max_tokens_key,
            )
            payload.pop("max_tokens", None)
            payload.pop("max_completion_tokens", None)
            payload[key] = request.max_tokens
        if request.response_schema is not None:
            schema = dict(request.response_schema)
            # Strict mode needs every property required and additionalProperties false;
            # a row can relax it with params {"strict_schema": false} (not sent upstream).
            strict = (self.config.params or {}).get("strict_schema", True) is not False
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name(schema), "schema": schema, "strict": strict},
            }
        return payload

    def stream_payload(self, request: AuditRequest) -> dict[str, Any]:
        payload = {**self.build_payload(request), "stream": True}
        if (self.config.params or {}).get("stream_include_usage", True) is not False:
            payload["stream_options"] = {"include_usage": True}
        return payload

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder:
        return ChatCompletionChunkDecoder(self)

    def embed_endpoint(self, request: AuditRequest) -> str:
        return f"{self.endpoint(request).removesuffix('/chat/completions')}/embeddings"

    def embed_payload(self, request: AuditRequest) -> dict[str, Any]:
        inputs = [x if isinstance(x, str) else list(x) for x in request.inputs]
        payload: dict[str, Any] = {
            "model": self.config.model,
            "input": inputs,
            "encoding_format": "base64",
        }
        dimensions = request.dimensions or (self.config.params or {}).get("dimensions")
        if dimensions is not None:
            payload["dimensions"] = dimensions
        if request.user is not None:
            payload["user"] = request.user
        return payload

    def parse_embeddings(self, data: Any, request: AuditRequest) -> ProviderResult:
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ResponseError("The response has no data list of embeddings.")
        ordered = sorted(
            items, key=lambda i: i.get("index") if isinstance(i.get("index"), int) else 0
        )
        vectors = tuple(
            vector_of(item.get("embedding"), f"data[{n}].embedding")
            for n, item in enumerate(ordered)
        )
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("model"),
            output="",
            input_tokens=usage.get("prompt_tokens", 0),
            vectors=vectors,
        )

    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            message = error.get("message")
            return (
                message if isinstance(message, str) else "",
                (error.get("code"), error.get("type")),
            )
        if isinstance(error, str):  # some compatible servers: {"error": "text"}
            return error, ()
        return "", ()

    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ResponseError("The response has no choices[0].message.") from None
        if not isinstance(message, dict):
            raise ResponseError("choices[0].message is not an object.")
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        content = message.get("content")
        if finish == "content_filter" or (message.get("refusal") and not content):
            raise ContentPolicyError(
                "The provider refused the request under its content policy.",
                code="content_filter",
            )
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ResponseError("choices[0].message.content is not a string.")
        tool_calls = _parse_tool_calls(message.get("tool_calls"))
        structured = None
        # A tool-call answer carries no structured text to validate.
        if request.response_schema is not None and (content or not tool_calls):
            structured = validate_structured(content, request.response_schema)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("model"),
            output=content,
            data=structured,
            input_tokens=usage.get("prompt_tokens", 0),
            output_tokens=usage.get("completion_tokens", 0),
            finish_reason=finish,
            tool_calls=tool_calls,
        )


def _parse_tool_calls(calls: object) -> tuple[ToolCall, ...]:
    """``message.tool_calls`` normalized (a missing id becomes ``call_<n>``; arguments
    a compatible server sends as an object become JSON text)."""
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise ResponseError("choices[0].message.tool_calls is not a list.")
    out: list[ToolCall] = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(function, dict):
            raise ResponseError("A tool call in choices[0].message is not an object.")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ResponseError("A tool call in choices[0].message has no function name.")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = compact_json(arguments)
        call_id = call.get("id")
        out.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{n}",
                name=name,
                arguments=arguments,
            )
        )
    return tuple(out)
