"""The OpenAPI reference text: each endpoint's summary, description and examples.

Kept apart from the views so that they hold request handling only; each view applies
its entry with ``@extend_schema(**ENTRY)``. What the examples show is what the code
answers (tests/test_api_schema.py checks the schema; the bodies follow ``to_dict()``).
"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse

__all__ = [
    "AUDIT",
    "AUDIT_JOB",
    "CHAT_COMPLETIONS",
    "EXPLAIN",
    "HEALTH",
    "MODELS",
    "documented",
]

REQUEST_ID = "6f1c2d7e-8a9b-4c3d-9e8f-0a1b2c3d4e5f"


def documented(entry: dict[str, Any], *, ok: Any = None) -> dict[str, Any]:
    """``extend_schema`` keyword arguments for ``entry``; ``ok`` is the 200 body's
    serializer when the view has one."""
    responses = dict(entry["responses"])
    if ok is not None:
        key = (200, "application/json") if (200, "application/json") in responses else 200
        responses[key] = OpenApiResponse(response=ok, description=responses[key].description)
    return {**entry, "responses": responses}


def _attempt(provider: str, model: str, outcome: str = "ok", **fields: Any) -> dict[str, Any]:
    return {
        "provider": provider,
        "model": model,
        "step": fields.get("step", 0),
        "outcome": outcome,
        "error_category": fields.get("error_category"),
        "http_status": fields.get("http_status"),
        "transient": fields.get("transient", False),
        "retries": fields.get("retries", 0),
        "latency_ms": fields.get("latency_ms", 0.21),
        "cost_usd": fields.get("cost_usd", 0.0),
    }


def _envelope(result: dict[str, Any], **meta: Any) -> dict[str, Any]:
    metadata = {
        "request_id": REQUEST_ID,
        "router_mode": "default",
        "route": None,
        "rule": None,
        "chain_name": "main",
        "requested_provider": None,
        "selected_provider": result["provider"],
        "chain": ["openai-main", "anthropic", "mock"],
        "attempted_providers": [result["provider"]],
        "skipped_providers": [],
        "attempts": [],
        "fallback_used": False,
        "fallback_reason": None,
        "cost_usd": 0.00096,
        "picks": [],
        "hedge": None,
        **meta,
    }
    full_result = {
        "mode": "live",
        "status": "ok",
        "output": "",
        "data": None,
        "usage": {"input_tokens": 412, "output_tokens": 58},
        "latency_ms": 843.5,
        "error": None,
        "tool_calls": [],
        "finish_reason": "stop" if result.get("status", "ok") == "ok" else None,
        **result,
    }
    return {
        "request_id": REQUEST_ID,
        "result": full_result,
        "routing_metadata": metadata,
        "diagnostics": dict(metadata),
    }


def _example(name: str, value: Any, *, summary: str, description: str = "", **kw: Any) -> Any:
    return OpenApiExample(name, value=value, summary=summary, description=description, **kw)


def _response(name: str, code: str, value: Any, summary: str, description: str = "") -> Any:
    return _example(
        name,
        value,
        summary=summary,
        description=description,
        response_only=True,
        status_codes=[code],
    )


def _request(name: str, value: Any, summary: str, description: str = "") -> Any:
    return _example(name, value, summary=summary, description=description, request_only=True)


UNAUTHENTICATED = {"detail": "Authentication credentials were not provided."}
THROTTLED = {"detail": "Request was throttled. Expected available in 21 seconds."}
#: A request over a budget's cap (docs/budgets.md).
BUDGET_EXCEEDED = {
    "budget": "alice-daily",
    "window": "day",
    "reset_at": "2026-12-04T00:00:00Z",
    "detail": "Budget 'alice-daily' is exhausted for this day; it resets at 2026-12-04T00:00:00Z.",
}

# --- POST /audit/ -----------------------------------------------------------------------

AUDIT_DESCRIPTION = """\
Send one request to a language model through the router and get the answer back
together with how it was routed.

The router picks the candidates — `force_provider`, else the chain of the first
matching routing rule (`route`, `task`), else the default chain — with an explicit
`provider` tried first. It skips candidates that cannot serve (disabled, key missing,
circuit open, capability missing), retries and fails over on transient faults only, and
ends with the built-in mock when every real provider failed.

**Every well-formed request gets 200**, whatever the providers did: the outcome is data.
`result.status` is `ok` (an answer, the mock's included), `error` (the walk stopped on a
failure that a fallback must not hide, such as a bad key) or `fallback` (a forced
provider that could not run); `routing_metadata` tells who was skipped, who was tried
and why a fallback happened. The `X-Request-ID` header repeats `request_id`.

Use it from any HTTP client. Variants of the same request:

* `"stream": true` answers `text/event-stream`: `chunk` events (`{"text": …}`), then
  exactly one `result` (this same envelope) or, after a failure mid-answer, one `error`
  event. Send `Accept: text/event-stream` or `application/json`.
* `"async": true` answers **202** with a job id; poll `GET /audit/jobs/{job_id}/`.
* `response_schema` (a JSON Schema) asks for structured output: `result.data` holds the
  parsed, validated object.

Errors: 400 names the bad fields (unknown fields too); 401/403 without valid
credentials; 403 for `force_provider` without its permission; 404 for a `chain`,
`provider` or `force_provider` that does not exist or that you may not use (the same
answer for both); 413 for a body over the size cap; 429 when throttled or over a budget
(`budget`, `window`, `reset_at`; `Retry-After`).
The raw input is never stored or logged — its length and SHA-256 only.
"""

AUDIT_OK = _envelope(
    {
        "provider": "openai-main",
        "model": "gpt-4o-mini",
        "output": "Django is a Python web framework that favours rapid development.",
    },
    chain=["openai-main", "anthropic", "mock"],
    attempts=[_attempt("openai-main", "gpt-4o-mini", latency_ms=843.5)],
)

AUDIT_FALLBACK = _envelope(
    {
        "provider": "anthropic",
        "model": "claude-3-5-haiku-latest",
        "output": "Django is a Python web framework that favours rapid development.",
        "latency_ms": 1204.2,
    },
    attempted_providers=["openai-main", "anthropic"],
    attempts=[
        _attempt(
            "openai-main",
            "gpt-4o-mini",
            "error",
            error_category="unavailable",
            http_status=503,
            transient=True,
            retries=2,
            latency_ms=2310.4,
        ),
        _attempt("anthropic", "claude-3-5-haiku-latest", latency_ms=1204.2),
    ],
    fallback_used=True,
    fallback_reason="unavailable",
)

AUDIT_MOCK = _envelope(
    {
        "provider": "mock",
        "model": "mock-1",
        "mode": "mock",
        "output": "[mock] summarize: deterministic mock answer c9f310778483eb2f for 26 "
        "characters of input.",
        "usage": {"input_tokens": 7, "output_tokens": 11},
        "latency_ms": 0.17,
    },
    skipped_providers=[
        {"provider": "openai-main", "reason": "missing_key"},
        {"provider": "anthropic", "reason": "disabled"},
    ],
    attempts=[_attempt("mock", "mock-1", latency_ms=0.17)],
    fallback_used=True,
    fallback_reason="missing_key",
)

AUDIT_ERROR = _envelope(
    {
        "provider": "openai-main",
        "model": "gpt-4o-mini",
        "mode": "error",
        "status": "error",
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "latency_ms": 95.0,
        "error": {
            "category": "authentication",
            "message": "Incorrect API key provided.",
            "http_status": 401,
            "transient": False,
        },
    },
    attempts=[
        _attempt(
            "openai-main",
            "gpt-4o-mini",
            "error",
            error_category="authentication",
            http_status=401,
            latency_ms=95.0,
        )
    ],
)

_STREAM_RESULT = json.dumps(
    {
        "request_id": REQUEST_ID,
        "result": {"provider": "openai-main", "output": "Django is a Python web framework."},
        "routing_metadata": {"…": "the same as the non-streamed answer"},
        "diagnostics": {"…": "…"},
    },
    ensure_ascii=False,
    separators=(",", ":"),
)
AUDIT_STREAM = (
    'event: chunk\ndata: {"text":"Django is a Python "}\n\n'
    'event: chunk\ndata: {"text":"web framework."}\n\n'
    f"event: result\ndata: {_STREAM_RESULT}\n\n"
)

AUDIT_STRUCTURED = _envelope(
    {
        "provider": "openai-main",
        "model": "gpt-4o-mini",
        "output": '{"sentiment": "positive", "score": 0.92}',
        "data": {"sentiment": "positive", "score": 0.92},
    },
    attempts=[_attempt("openai-main", "gpt-4o-mini", latency_ms=843.5)],
)

AUDIT: dict[str, Any] = {
    "summary": "Route one LLM request through the provider chain",
    "description": AUDIT_DESCRIPTION,
    "responses": {
        (200, "application/json"): OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="The answer and how it was routed — for every well-formed request.",
        ),
        (200, "text/event-stream"): OpenApiResponse(
            # One server-sent event (what SSE-aware tools check each event against).
            response={
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["chunk", "result", "error"]},
                    "data": {"type": "string", "description": "The event's JSON object."},
                },
                "required": ["event", "data"],
            },
            description='`"stream": true`: `chunk` events, then one `result` or `error` event.',
        ),
        (202, "application/json"): OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description='`"async": true` — the job id and the URL to poll.',
        ),
        (400, "application/json"): OpenApiResponse(
            response=OpenApiTypes.OBJECT, description="Invalid input: errors keyed by field."
        ),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        403: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="A permission you lack (forcing a provider): the reason "
            "(docs/operations.md, who may route where).",
        ),
        404: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="A chain or provider that does not exist or that you may not use "
            "(the same answer for both).",
        ),
        413: OpenApiResponse(
            response=OpenApiTypes.OBJECT, description="The body is over `MAX_REQUEST_BYTES`."
        ),
        429: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="Throttled, or a budget is exhausted (`budget`, `window`, "
            "`reset_at`); see `Retry-After`.",
        ),
    },
    "examples": [
        _request(
            "Summarize",
            {"task": "summarize", "input_text": "Django is a web framework written in Python."},
            "The smallest request: a task and the input",
        ),
        _request(
            "By route, with instructions and tags",
            {
                "task": "summarize",
                "instructions": "Answer in one sentence.",
                "input_text": "Django is a web framework written in Python.",
                "route": "cheap",
                "metadata": {"team": "search"},
            },
            "A routing rule picks the chain for route `cheap`",
        ),
        _request(
            "Structured output",
            {
                "task": "classify",
                "input_text": "I love this framework.",
                "response_schema": {
                    "type": "object",
                    "properties": {
                        "sentiment": {"enum": ["positive", "neutral", "negative"]},
                        "score": {"type": "number"},
                    },
                    "required": ["sentiment", "score"],
                },
            },
            "`result.data` holds the parsed object",
        ),
        _request(
            "A provider first",
            {"task": "summarize", "input_text": "…", "provider": "anthropic"},
            "Router mode `explicit`: `anthropic` first, then the chain",
        ),
        _request(
            "Streamed",
            {"task": "summarize", "input_text": "…", "stream": True},
            "Server-sent events: chunk … then result (or error)",
        ),
        _request(
            "Async job",
            {"task": "summarize", "input_text": "…", "async": True},
            "202 with a job id to poll",
        ),
        _response("Served by the first provider", "200", AUDIT_OK, "Success, no fallback"),
        _response(
            "Fallback after a transient failure",
            "200",
            AUDIT_FALLBACK,
            "The primary answered 503 three times; the next provider served",
        ),
        _response(
            "Skipped candidates, the mock answered",
            "200",
            AUDIT_MOCK,
            "Keys missing or providers disabled: the built-in mock answered",
        ),
        _response(
            "Bad key: an error result, no fallback",
            "200",
            AUDIT_ERROR,
            "Authentication failures stop the walk: a bad key is never papered over",
        ),
        _response("Structured answer", "200", AUDIT_STRUCTURED, "With `response_schema`"),
        _example(
            "Stream",
            AUDIT_STREAM,
            summary='`"stream": true`: chunks, then the envelope',
            response_only=True,
            status_codes=["200"],
            media_type="text/event-stream",
        ),
        _response(
            "Job accepted",
            "202",
            {
                "job_id": "5b0c8f2e-3d4a-4b6c-8e9f-1a2b3c4d5e6f",
                "status": "pending",
                "status_url": "https://api.example.com/audit/jobs/5b0c8f2e-3d4a-4b6c-8e9f-1a2b3c4d5e6f/",
            },
            "Poll `status_url` until `done`",
        ),
        _response(
            "Field errors",
            "400",
            {
                "task": [
                    "Enter a slug matching ^[-a-zA-Z0-9_]+$: letters, digits, hyphens and "
                    'underscores only, for example "summarize" or "openai-main".'
                ],
                "input_text": ["This field is required."],
                "input": ["Unknown field."],
            },
            "Each bad field with its messages",
        ),
        _response("Not authenticated", "401", UNAUTHENTICATED, "No or an invalid token"),
        _response(
            "Not allowed",
            "403",
            {"detail": "Forcing a provider needs the llm_routing.force_provider permission."},
            "force_provider without the permission",
        ),
        _response(
            "Not found",
            "404",
            {"detail": "No provider 'premium-gpt' that you may use."},
            "A provider that does not exist or that you may not use",
        ),
        _response(
            "Body too large", "413", {"detail": "Request body too large."}, "Over the size cap"
        ),
        _response("Throttled", "429", THROTTLED, "Over the per-user rate"),
        _response("Over a budget", "429", BUDGET_EXCEEDED, "A budget's cap is reached"),
    ],
}

# --- GET /audit/jobs/{job_id}/ -------------------------------------------------------------

JOB_ID = "5b0c8f2e-3d4a-4b6c-8e9f-1a2b3c4d5e6f"
JOB_URL = f"https://api.example.com/audit/jobs/{JOB_ID}/"
JOB_TIMES = {"created_at": "2026-12-03T09:00:00.120000+00:00"}

AUDIT_JOB: dict[str, Any] = {
    "summary": "Poll an async audit job",
    "description": """\
The state of a job created by `POST /audit/` with `"async": true`: `pending`, `running`,
`done` or `failed`. Poll it (every second or two) until it is `done`: the body then also
carries the same `request_id`, `result`, `routing_metadata` and `diagnostics` as the
synchronous answer, and `X-Request-ID` is set. `failed` means the job could not be run
(it carries `error`); a provider failure is still a `done` job whose `result.status`
says so.

Only the job's owner, or a staff user, sees it; any other caller gets the same 404 as
for an id that does not exist. Finished jobs are purged after `RETENTION_DAYS`.
""",
    "responses": {
        200: OpenApiResponse(response=OpenApiTypes.OBJECT, description="The job."),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        404: OpenApiResponse(
            response=OpenApiTypes.OBJECT, description="No such job, or not yours."
        ),
        429: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Throttled."),
    },
    "examples": [
        _response(
            "Still pending",
            "200",
            {
                "job_id": JOB_ID,
                "status": "pending",
                "status_url": JOB_URL,
                **JOB_TIMES,
                "started_at": None,
                "finished_at": None,
            },
            "Queued, not started yet",
        ),
        _response(
            "Done",
            "200",
            {
                "job_id": JOB_ID,
                "status": "done",
                "status_url": JOB_URL,
                **JOB_TIMES,
                "started_at": "2026-12-03T09:00:00.180000+00:00",
                "finished_at": "2026-12-03T09:00:01.030000+00:00",
                **AUDIT_FALLBACK,
            },
            "The synchronous envelope, here after a fallback",
        ),
        _response("Unknown or not yours", "404", {"detail": "No such job."}, "Not found"),
        _response("Not authenticated", "401", UNAUTHENTICATED, "No or an invalid token"),
        _response("Throttled", "429", THROTTLED, "Over the per-user rate"),
    ],
}

# --- GET /health/ ----------------------------------------------------------------------------


def _circuit(model: str, state: str = "closed", **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "state": state,
        "consecutive_failures": fields.get("consecutive_failures", 0),
        "cooldown_step": fields.get("cooldown_step", 0),
        "open_until": fields.get("open_until"),
        "last_success_at": fields.get("last_success_at", "2026-12-03T08:59:58+00:00"),
        "last_error_at": fields.get("last_error_at"),
        "last_error_category": fields.get("last_error_category"),
        "last_http_status": fields.get("last_http_status"),
    }


HEALTH: dict[str, Any] = {
    "summary": "Health: a summary, or every provider for operators",
    "description": """\
Every authenticated caller gets the summary: `status` and `cache` (`ok`, or `degraded`
while the circuit cache is unreachable). **Operators** — staff users, superusers, or a
request carrying `Authorization: Bearer <LLM_ROUTING["METRICS_TOKEN"]>` (no user
needed) — also get `providers`: the passive health of every provider row, whether it is
enabled, whether its key variable is set (never the key), and the circuit breaker of its
model and of each model a chain entry overrides it with — state (`closed`, `open`,
`half_open`), consecutive failures, when it reopens, the last success and the last
error's category and HTTP status. Provider names and key presence are internal
information (docs/operations.md, "Who sees what").

Health comes only from real calls: nothing is probed by this endpoint. Use it for
dashboards and alerting (an `open` circuit means the router is skipping that model).
`manage.py llm_routing_circuits` shows the same from a shell.
""",
    "responses": {
        200: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Health per provider."),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        429: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Throttled."),
    },
    "examples": [
        _response(
            "One healthy, one open circuit",
            "200",
            {
                "status": "ok",
                "cache": "ok",
                "providers": [
                    {
                        "name": "anthropic",
                        "kind": "anthropic",
                        "model": "claude-3-5-haiku-latest",
                        "mode": "live",
                        "enabled": True,
                        "key_present": True,
                        "health": _circuit("claude-3-5-haiku-latest"),
                        "overrides": [],
                    },
                    {
                        "name": "openai-main",
                        "kind": "openai",
                        "model": "gpt-4o-mini",
                        "mode": "live",
                        "enabled": True,
                        "key_present": True,
                        "health": _circuit(
                            "gpt-4o-mini",
                            "open",
                            consecutive_failures=3,
                            cooldown_step=1,
                            open_until="2026-12-03T09:00:12+00:00",
                            last_error_at="2026-12-03T09:00:10+00:00",
                            last_error_category="unavailable",
                            last_http_status=503,
                        ),
                        "overrides": [],
                    },
                ],
            },
            "An operator's view: `openai-main` is being skipped as `circuit_open` until "
            "`open_until`",
        ),
        _response(
            "A caller's summary",
            "200",
            {"status": "ok", "cache": "ok"},
            "Any authenticated caller who is not an operator",
        ),
        _response("Not authenticated", "401", UNAUTHENTICATED, "No or an invalid token"),
        _response("Throttled", "429", THROTTLED, "Over the per-user rate"),
    ],
}

# --- the OpenAI-compatible face --------------------------------------------------------------


def _openai_error(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


CHAT_MESSAGES = [
    {"role": "system", "content": "Answer in one sentence."},
    {"role": "user", "content": "What is Django?"},
]


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-6f1c2d7e8a9b4c3d9e8f0a1b2c3d4e5f",
        "object": "chat.completion",
        "created": 1796288400,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 21,
            "completion_tokens": 14,
            "total_tokens": 35,
            "cost_usd": 0.0000116,
        },
        "system_fingerprint": None,
    }


CHAT_COMPLETIONS: dict[str, Any] = {
    "summary": "OpenAI-compatible chat completions",
    "description": """\
The same router behind the OpenAI Chat Completions wire format, so any OpenAI client or
SDK can use it: set the client's base URL to this app's `/v1` and use a DRF token as
the API key.

`model` names a chain (router mode `chain`), a route key (the rules decide) or a
provider (tried first, then the default chain) — `GET /v1/models` lists them. The
answer's `model` is the model that actually served, and the headers tell the rest:
`X-Request-ID` (the routing decision in the admin), `X-LLM-Provider`,
`X-LLM-Attempts`. `"stream": true` answers OpenAI-style SSE chunks ending in
`data: [DONE]` (`stream_options.include_usage` adds a usage chunk); a failure after the
first chunk ends the stream with an in-band error object and no `[DONE]`.

Unlike `POST /audit/`, failures are HTTP errors in OpenAI's envelope, so SDKs raise
them: 400 for an invalid request (also a context-length or content-policy refusal
upstream), 401 without valid credentials, 404 for an unknown `model`, 429 when throttled
or over a budget (code `budget_exceeded`), 502 when the upstream rejected the key or
answered garbage, 503 when every real candidate was skipped or failed — with the request
id and each candidate's reason, never a mock answer presented as a real one (unless the
chain opts in with `mock_backstop`). Transient upstream failures fail over first and
never reach you. Conversations pass through with roles and order intact; `tools` /
`tool_choice` work with every vendor kind, and tool calls come back as
`message.tool_calls` (streamed as `delta.tool_calls`) with `finish_reason` `tool_calls`.
Types are strict and an unknown parameter is a 400 naming it.
""",
    "responses": {
        200: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="A `chat.completion` object (or `text/event-stream` chunks).",
        ),
        400: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Invalid request."),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        404: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="Unknown `model`, or one the caller may not use (the same answer).",
        ),
        429: OpenApiResponse(
            response=OpenApiTypes.OBJECT, description="Throttled, or a budget is exhausted."
        ),
        502: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="The upstream rejected the key or answered an unusable body.",
        ),
        503: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Every candidate failed."),
    },
    "examples": [
        _request(
            "A chain",
            {"model": "default", "messages": CHAT_MESSAGES},
            "`model` names a chain",
        ),
        _request(
            "A provider, streamed",
            {"model": "openai-main", "messages": CHAT_MESSAGES, "stream": True},
            "`model` names a provider; OpenAI-style SSE chunks",
        ),
        _request(
            "Structured output",
            {
                "model": "default",
                "messages": CHAT_MESSAGES,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "answer",
                        "schema": {
                            "type": "object",
                            "properties": {"answer": {"type": "string"}},
                            "required": ["answer"],
                        },
                    },
                },
            },
            "`response_format` json_schema → structured output",
        ),
        _response(
            "Completion",
            "200",
            _completion("gpt-4o-mini", "Django is a Python web framework."),
            "Served by the chain's first provider",
        ),
        _response(
            "Completion after a fallback",
            "200",
            _completion("claude-3-5-haiku-latest", "Django is a Python web framework."),
            "The primary failed over: `model` (and `X-LLM-Provider`) name who served",
        ),
        _response(
            "Invalid request",
            "400",
            _openai_error(
                "messages: This field is required.",
                "invalid_request_error",
                "invalid_value",
                "messages",
            ),
            "A missing or malformed field",
        ),
        _response(
            "Not authenticated",
            "401",
            _openai_error(
                "Authentication credentials were not provided.",
                "authentication_error",
                "not_authenticated",
            ),
            "No or an invalid token",
        ),
        _response(
            "Unknown model",
            "404",
            _openai_error(
                "The model 'gpt-5' does not exist or you do not have access to it "
                "(see GET /v1/models).",
                "invalid_request_error",
                "model_not_found",
            ),
            "`model` names no chain, route or provider — or one you may not use: the "
            "same answer, so names cannot be probed",
        ),
        _response(
            "Throttled",
            "429",
            _openai_error(THROTTLED["detail"], "rate_limit_error", "throttled"),
            "Over the per-user rate",
        ),
        _response(
            "Over a budget",
            "429",
            {
                "error": {
                    **_openai_error(
                        BUDGET_EXCEEDED["detail"], "rate_limit_error", "budget_exceeded"
                    )["error"],
                    "budget": "alice-daily",
                    "window": "day",
                    "reset_at": "2026-12-04T00:00:00Z",
                }
            },
            "A budget's cap is reached",
        ),
        _response(
            "Upstream rejected the key",
            "502",
            _openai_error(
                "Incorrect API key provided.", "upstream_error", "upstream_authentication"
            ),
            "Never failed over: fix the key",
        ),
        _response(
            "No provider available",
            "503",
            {
                "error": {
                    "message": "No provider could serve the request: every candidate was "
                    "skipped or failed.",
                    "type": "service_unavailable",
                    "param": None,
                    "code": "no_provider_available",
                    "request_id": REQUEST_ID,
                    "candidates": [
                        {"provider": "openai-main", "outcome": "skipped", "reason": "missing_key"},
                        {"provider": "anthropic", "outcome": "error", "reason": "unavailable"},
                    ],
                }
            },
            "Every real candidate was skipped or failed: no mock answer unless the chain "
            "opts in (`mock_backstop`)",
        ),
    ],
}

FACES = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
WITH_EMBEDDINGS = [*FACES, "/v1/embeddings"]
MODELS: dict[str, Any] = {
    "summary": "List what `model` may name",
    "description": """\
The names that `POST /v1/chat/completions`, `POST /v1/responses`,
`POST /v1/messages` and `POST /v1/embeddings` accept as `model`, in OpenAI's list
format: every chain (`owned_by: "chain"`), every route key of an enabled rule or of
`LLM_ROUTING["ROUTES"]` (`"route"`), every enabled provider (`"provider"`) and the
built-in `mock`. `faces` lists the paths each name can be used on: every vendor kind
serves the three chat faces, and `/v1/embeddings` is listed for a name with at least
one enabled provider that serves embeddings (`openai`, `openai_compatible`, `gemini`,
the mock; not `anthropic`). OpenAI clients call it to
discover models; use it to check a name before you configure a client.
""",
    "responses": {
        200: OpenApiResponse(response=OpenApiTypes.OBJECT, description="The model list."),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        429: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Throttled."),
    },
    "examples": [
        _response(
            "Chains, routes and providers",
            "200",
            {
                "object": "list",
                "data": [
                    {
                        "id": "default",
                        "object": "model",
                        "created": 0,
                        "owned_by": "chain",
                        "faces": FACES,
                    },
                    {
                        "id": "cheap",
                        "object": "model",
                        "created": 0,
                        "owned_by": "route",
                        "faces": FACES,
                    },
                    {
                        "id": "openai-main",
                        "object": "model",
                        "created": 0,
                        "owned_by": "provider",
                        "faces": WITH_EMBEDDINGS,
                    },
                    {
                        "id": "mock",
                        "object": "model",
                        "created": 0,
                        "owned_by": "provider",
                        "faces": WITH_EMBEDDINGS,
                    },
                ],
            },
            "One entry per name",
        ),
        _response(
            "Not authenticated",
            "401",
            _openai_error(
                "Authentication credentials were not provided.",
                "authentication_error",
                "not_authenticated",
            ),
            "No or an invalid token",
        ),
        _response(
            "Throttled",
            "429",
            _openai_error(THROTTLED["detail"], "rate_limit_error", "throttled"),
            "Over the per-user rate",
        ),
    ],
}


# --- GET /audit/explain/ ------------------------------------------------------------------


def _candidate(position: int, provider: str, model: str, **fields: Any) -> dict[str, Any]:
    return {
        "position": position,
        "provider": provider,
        "model": model,
        "verdict": fields.get("verdict", "try"),
        "reason": fields.get("reason"),
        "missing_capability": fields.get("missing_capability"),
        "circuit": fields.get("circuit", "closed"),
        "open_until": fields.get("open_until"),
        "probe": False,
        "timeout_s": 30.0,
        "first_token_timeout_s": 10.0,
        "max_retries": fields.get("max_retries", 2),
        "backstop": fields.get("backstop", False),
        "step": position,
    }


EXPLAIN: dict[str, Any] = {
    "summary": "Explain how a request would be routed, without sending it",
    "description": """\
Shows what `POST /audit/` would do with a request right now — the rule that matches,
the chain, and every candidate in order with its verdict (`try`, or `skip` with the
reason the walk would record: `unknown_provider`, `disabled`, `missing_key`,
`unsupported` with the missing capability, `circuit_open` with when it reopens), each
candidate's effective timeouts and retries, and the request's budget.

Nothing is sent: no provider is called, nothing is recorded, no circuit changes (a
half-open circuit's probe slot stays free for the next real request). Use it to check a
new chain or rule before traffic reaches it, or to see why requests fall back. The
query takes `task` (required), `route`, `provider`, `force_provider`, `chain`,
`stream=true`, `schema` (a JSON Schema as JSON text), `request_id` (a step of several
candidates is ordered by its strategy as for that request: a routed request's id replays
its picks, listed in `picks`) and `affinity` (a prompt-cache affinity key, else the
`X-LLM-Affinity` header). It cannot foresee a provider failing at call time. Same
authentication, permissions and throttles as `/audit/`.

With an affinity key, each step of several reads — never writes — the candidate that
served the key last, as the walk does (the pick's reason is then `affinity`), and
`affinity` lists per such step `remembered` (null: nothing yet), `serves` (the
candidate it would try first now) and `outcome`: `kept`, `moved` (the remembered one is
unavailable: the key would move to whoever answers) or `new`; `affinity` is null without
a key. `hedge` says whether the first attempt would be hedged: the chain's
`hedge_after_ms` (milliseconds, `"p95"`, or null), `after_ms` (what it resolves to now;
null for `"p95"` with no p95 yet), the `primary`, the hedge `candidate` (the next
candidate the walk would try, never the mock) and `reason` when no hedge would start:
`not_configured`, `forced`, `no_primary`, `mock`, `probe`, `no_p95_yet`,
`no_candidate`, `unavailable`, `attempt_budget` or `deadline` (a budget's cost cap is
not foreseen).

It shows a caller only what they may use (docs/operations.md, "Who sees what"): a
`chain` that does not exist or that they may not use is the same 404; a provider they
may not use reads as `unknown_provider` when they named it and is left out otherwise,
and a chain or rule they may not use is not named. Staff see everything.
""",
    "responses": {
        200: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="The plan and each candidate's verdict, in order.",
        ),
        400: OpenApiResponse(
            response=OpenApiTypes.OBJECT, description="Invalid query: errors keyed by field."
        ),
        401: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Not authenticated."),
        404: OpenApiResponse(
            response=OpenApiTypes.OBJECT,
            description="`chain` names no chain the caller may use (absent or not theirs).",
        ),
        429: OpenApiResponse(response=OpenApiTypes.OBJECT, description="Throttled."),
    },
    "examples": [
        _response(
            "Primary circuit open",
            "200",
            {
                "router_mode": "default",
                "rule": None,
                "chain_name": "default",
                "requested_provider": None,
                "configured": True,
                "stream_mode": "direct",
                "would_serve_first": "anthropic",
                "budget": {"deadline_s": 60.0, "max_attempts": 4},
                "candidates": [
                    _candidate(
                        0,
                        "openai-main",
                        "gpt-4o-mini",
                        verdict="skip",
                        reason="circuit_open",
                        circuit="open",
                        open_until="2026-12-03T09:00:30Z",
                    ),
                    _candidate(1, "anthropic", "claude-3-5-haiku-latest"),
                    _candidate(2, "mock", "mock-1", circuit="n/a", max_retries=0, backstop=True),
                ],
                "picks": [],
                "affinity": None,
                "hedge": {
                    "hedge_after_ms": "p95",
                    "after_ms": 840.0,
                    "primary": "anthropic",
                    "candidate": None,
                    "reason": "no_candidate",
                },
            },
            "`openai-main` would be skipped until `open_until`; `anthropic` would serve",
        ),
        _response(
            "Affinity kept, hedged after 400 ms",
            "200",
            {
                "router_mode": "default",
                "rule": None,
                "chain_name": "default",
                "requested_provider": None,
                "configured": True,
                "stream_mode": "direct",
                "would_serve_first": "oa-key2",
                "budget": {"deadline_s": 60.0, "max_attempts": 4},
                "candidates": [
                    _candidate(0, "oa-key2", "gpt-4o-mini"),
                    {**_candidate(1, "oa-key1", "gpt-4o-mini"), "step": 0},
                    {**_candidate(2, "anthropic", "claude-3-5-haiku-latest"), "step": 1},
                    {
                        **_candidate(3, "mock", "mock-1", circuit="n/a", max_retries=0),
                        "backstop": True,
                        "step": 2,
                    },
                ],
                "picks": [
                    {
                        "step": 0,
                        "strategy": "weighted",
                        "picked": "oa-key2",
                        "reason": "affinity",
                        "order": ["oa-key2", "oa-key1"],
                        "weights": {"oa-key1": 1.0, "oa-key2": 1.0},
                        "draw": 0.1742,
                    }
                ],
                "affinity": [
                    {"step": 0, "remembered": "oa-key2", "serves": "oa-key2", "outcome": "kept"}
                ],
                "hedge": {
                    "hedge_after_ms": 400,
                    "after_ms": 400.0,
                    "primary": "oa-key2",
                    "candidate": "oa-key1",
                    "reason": None,
                },
            },
            "`affinity=conv-42`: the step goes back to `oa-key2`; `oa-key1` would hedge",
        ),
        _response(
            "Bad query",
            "400",
            {"task": ["This field is required."]},
            "`task` is missing",
        ),
        _response("Not authenticated", "401", UNAUTHENTICATED, "No or an invalid token"),
        _response(
            "No such chain",
            "404",
            {"detail": "No chain 'premium' that you may use."},
            "`chain` does not exist, or the caller may not use it: the same answer",
        ),
        _response("Throttled", "429", THROTTLED, "Over the per-user rate"),
    ],
}
