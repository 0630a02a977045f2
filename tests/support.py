"""Helpers for tests that run the demo project's ``manage.py`` or a server (in a
subprocess, or uvicorn in a thread), and read its streams."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "ROOT",
    "chat_words",
    "clean_env",
    "database_url",
    "free_port",
    "manage",
    "python",
    "uvicorn_server",
    "wait_for",
]


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment (no settings leak in from the test run) plus ``extra``."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(extra)
    return env


def manage(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python manage.py *args`` in the project root; never raises on a failing command."""
    return python("manage.py", *args, env=env, timeout=timeout)


def python(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` in the project root."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url() -> str:
    """The test database as a ``DATABASE_URL`` for a server started in a subprocess."""
    from django.db import connection

    s = connection.settings_dict
    auth = quote(s["USER"] or "postgres")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextmanager
def uvicorn_server(app: Any, *, lifespan: str = "on") -> Iterator[str]:
    """``app`` under uvicorn, in a thread of this process (the test's environment and
    settings reach it): its base URL while the block runs."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan=lifespan, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    """Whether ``predicate`` came true within ``seconds`` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def chat_words(response: httpx.Response, count: int) -> list[str]:
    """The ``content`` deltas of a streamed ``chat.completion.chunk`` answer, read until
    ``count`` of them came (the caller then leaves mid-stream) or the stream ended."""
    received: list[str] = []
    for line in response.iter_lines():
        if line.startswith("data: {"):
            delta = json.loads(line[len("data: ") :])["choices"][0]["delta"]
            if delta.get("content"):
                received.append(delta["content"])
        if len(received) == count:
            break
    return received
