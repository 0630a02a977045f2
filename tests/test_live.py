"""Live smoke tests against the real vendor APIs.

Marked ``live`` (excluded from the embedded and services suites) and skipped unless the
vendor's key variable is set. Run them by hand::

    OPENAI_API_KEY=… ANTHROPIC_API_KEY=… GEMINI_API_KEY=… \\
        .venv/bin/python -m pytest -m live tests/test_live.py

Models can be changed with ``LIVE_OPENAI_MODEL``, ``LIVE_ANTHROPIC_MODEL`` and
``LIVE_GEMINI_MODEL``.
"""

from __future__ import annotations

import os

import pytest

from llm_routing import errors
from llm_routing.providers.base import read_api_key
from llm_routing.providers.registry import get_adapter_class
from llm_routing.types import AuditRequest, ProviderConfig

VENDORS = {
    # kind: (key variable, model variable, default model)
    "openai": ("OPENAI_API_KEY", "LIVE_OPENAI_MODEL", "gpt-4o-mini"),
    "anthropic": ("ANTHROPIC_API_KEY", "LIVE_ANTHROPIC_MODEL", "claude-3-5-haiku-latest"),
    "gemini": ("GEMINI_API_KEY", "LIVE_GEMINI_MODEL", "gemini-2.0-flash"),
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _config(kind: str, **extra: object) -> ProviderConfig:
    key_env, model_env, default_model = VENDORS[kind]
    if not os.environ.get(key_env):
        pytest.skip(f"{key_env} is not set")
    return ProviderConfig(
        name=f"live-{kind}",
        kind=kind,
        model=os.environ.get(model_env, default_model),
        api_key_env=key_env,
        timeout_s=60.0,
        params={"max_tokens": 64},
        supports_structured_output=True,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.live
@pytest.mark.parametrize("kind", list(VENDORS))
def test_live_completion(kind: str) -> None:
    config = _config(kind)
    adapter = get_adapter_class(kind)(config)
    try:
        result = adapter.complete(
            AuditRequest(task="smoke", input_text="Say the word pong.", instructions="One word."),
            api_key=read_api_key(config.api_key_env),
            timeout=60.0,
        )
    finally:
        adapter.close()
    assert result.ok and result.output.strip()
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0


@pytest.mark.live
@pytest.mark.parametrize("kind", list(VENDORS))
def test_live_structured_output(kind: str) -> None:
    config = _config(kind)
    adapter = get_adapter_class(kind)(config)
    try:
        result = adapter.complete(
            AuditRequest(task="smoke", input_text="What is 2 + 3?", response_schema=SCHEMA),
            api_key=read_api_key(config.api_key_env),
            timeout=60.0,
        )
    finally:
        adapter.close()
    assert result.data == {"answer": 5}


@pytest.mark.live
@pytest.mark.parametrize("kind", list(VENDORS))
def test_live_bad_key_is_authentication(kind: str) -> None:
    config = _config(kind)
    adapter = get_adapter_class(kind)(config)
    try:
        with pytest.raises(errors.AuthenticationError):
            adapter.complete(
                AuditRequest(task="smoke", input_text="ping"),
                api_key="invalid-key-for-smoke-test",
                timeout=60.0,
            )
    finally:
        adapter.close()
