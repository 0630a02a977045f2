"""Log redaction: key values never reach a log record (docs/operations.md).

:class:`RedactKeysFilter` replaces every known provider key value in a record's
message, arguments, exception text and stack text with ``[redacted]``. "Known" means
the value, read from the environment when the filter runs, of every variable that
:func:`llm_routing.providers.base.read_api_key` has handed out in this process (names
are remembered, values never) plus the variables in :data:`EXTRA_KEY_ENV_NAMES` given
to :func:`install`.

:func:`install` attaches one filter to the ``llm_routing``, ``httpx`` and ``httpcore``
loggers and to their module loggers (a logger's filters do not see records of its
children, so each is attached by name). ``LlmRoutingConfig.ready()`` calls it; it is
idempotent. The system check ``llm_routing.W010`` warns when httpx/httpcore debug
logging — which logs request lines and headers — is switched on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime

from .errors import scrub

__all__ = [
    "LOGGER_NAMES",
    "JsonFormatter",
    "RedactKeysFilter",
    "RequestIdFilter",
    "bound_request_id",
    "current_request_id",
    "install",
    "known_key_values",
    "redact",
    "remember_key_env",
]

#: Loggers the filter is attached to (children by name: filters do not propagate).
LOGGER_NAMES = (
    "llm_routing",
    "llm_routing.router",
    "llm_routing.retry",
    "llm_routing.recorder",
    "llm_routing.signals",
    "llm_routing.providers",
    "llm_routing.tasks",
    "llm_routing.breaker",
    "llm_routing.stream",
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)

_names: set[str] = set()
_names_lock = threading.Lock()


def remember_key_env(env_name: str) -> None:
    """Remember the NAME of a variable holding a key; its value is read when filtering."""
    if env_name and env_name not in _names:
        with _names_lock:
            _names.add(env_name)


def known_key_values(extra_names: Iterable[str] = ()) -> list[str]:
    """Current values of every remembered key variable (longest first)."""
    values = {os.environ.get(n, "") for n in (*_names, *extra_names)}
    return sorted((v for v in values if v and len(v) >= 4), key=len, reverse=True)


def redact(text: str, extra_names: Iterable[str] = ()) -> str:
    return scrub(text, known_key_values(extra_names))


class RedactKeysFilter(logging.Filter):
    """Rewrites records that contain a key value; never drops a record."""

    def __init__(self, name: str = "", *, extra_names: Iterable[str] = ()) -> None:
        super().__init__(name)
        self.extra_names = tuple(extra_names)

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = known_key_values(self.extra_names)
        if not secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is not ours to fix
            message = str(record.msg)
        clean = scrub(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, secrets)
        return True


_installed: RedactKeysFilter | None = None


def install(extra_names: Iterable[str] = ()) -> RedactKeysFilter:
    """Attach one :class:`RedactKeysFilter` to every logger of :data:`LOGGER_NAMES` and
    to every already-created logger below ``llm_routing``, ``httpx`` and ``httpcore``.

    Idempotent; HTTP adapters call it again when they are built, which catches module
    loggers created after start-up.
    """
    global _installed
    if _installed is None:
        _installed = RedactKeysFilter(extra_names=extra_names)
    existing = [
        name
        for name, obj in list(logging.root.manager.loggerDict.items())
        if isinstance(obj, logging.Logger) and name.startswith(_PREFIXES)
    ]
    for name in (*LOGGER_NAMES, *existing):
        logger = logging.getLogger(name)
        if _installed not in logger.filters:
            logger.addFilter(_installed)
    return _installed


_PREFIXES = ("llm_routing.", "httpx.", "httpcore.")


# --- request ids -----------------------------------------------------------------------

_request_id: ContextVar[str | None] = ContextVar("llm_routing_request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request being served in this context, or None."""
    return _request_id.get()


@contextlib.contextmanager
def bound_request_id(request_id: str) -> Iterator[str]:
    """Log records written inside carry ``request_id`` (restored on exit)."""
    token = _request_id.set(request_id)
    try:
        yield request_id
    finally:
        _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (the current request's id, else ``-``); never drops a
    record. Install it on a handler so records of every logger get it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = _request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``request_id`` and, when there is one, ``exc_info`` (the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or _request_id.get(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)
