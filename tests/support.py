"""Helpers for tests that run the demo project's ``manage.py`` or a server in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "clean_env", "database_url", "free_port", "manage", "python"]


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
