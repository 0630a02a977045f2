"""The key-redacting log filter (llm_routing.logging) and system check W010."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from llm_routing.checks import check_http_debug_logging
from llm_routing.logging import (
    LOGGER_NAMES,
    RedactKeysFilter,
    install,
    known_key_values,
    redact,
    remember_key_env,
)
from llm_routing.providers.base import read_api_key

CANARY = "sk-CANARY-logging-5b2d4680"


@pytest.fixture
def canary(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CANARY_LOGGING_KEY", CANARY)
    remember_key_env("CANARY_LOGGING_KEY")
    return CANARY


def test_read_api_key_remembers_the_name_not_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANOTHER_PROVIDER_KEY", "sk-another-999999")
    assert "sk-another-999999" not in known_key_values()
    read_api_key("ANOTHER_PROVIDER_KEY")
    assert "sk-another-999999" in known_key_values()
    monkeypatch.delenv("ANOTHER_PROVIDER_KEY")
    assert "sk-another-999999" not in known_key_values()  # values are read when filtering


def test_installed_on_every_named_logger() -> None:
    installed = install()
    assert install() is installed  # idempotent
    for name in LOGGER_NAMES:
        assert logging.getLogger(name).filters.count(installed) == 1, name


@pytest.mark.parametrize("name", ["llm_routing.router", "httpx", "httpcore.http11", "llm_routing"])
def test_message_and_args_are_redacted(
    name: str, canary: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    logging.getLogger(name).warning("headers: %s", {"x-api-key": canary})
    logging.getLogger(name).warning(f"inline {canary}")
    assert canary not in caplog.text
    assert caplog.text.count("[redacted]") == 2


def test_exception_text_is_redacted(canary: str, caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise RuntimeError(f"upstream said: bad key {canary}")
    except RuntimeError:
        logging.getLogger("llm_routing.retry").exception("adapter failed")
    assert canary not in caplog.text
    assert "[redacted]" in caplog.text
    assert "RuntimeError" in caplog.text


def test_filter_never_drops_records_and_leaves_clean_ones_alone(canary: str) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "count=%d", (3,), None)
    assert RedactKeysFilter().filter(record) is True
    assert record.getMessage() == "count=3" and record.args == (3,)


def test_redact(canary: str) -> None:
    assert redact(f"a {canary} b") == "a [redacted] b"


@pytest.fixture
def restore_levels() -> Iterator[None]:
    levels = {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restore_levels")
def test_w010_warns_when_httpx_debug_logging_is_on() -> None:
    logging.getLogger("httpx").setLevel(logging.INFO)
    logging.getLogger("httpcore").setLevel(logging.INFO)
    assert check_http_debug_logging() == []
    logging.getLogger("httpcore").setLevel(logging.DEBUG)
    (warning,) = check_http_debug_logging()
    assert warning.id == "llm_routing.W010"
    assert "httpcore" in warning.msg and "httpx" not in warning.msg
    assert warning.hint


def test_install_covers_loggers_created_later(
    canary: str, caplog: pytest.LogCaptureFixture
) -> None:
    late = logging.getLogger("llm_routing.created_later")
    install()
    late.error("late %s", canary)
    assert canary not in caplog.text and "late [redacted]" in caplog.text
