"""Helpers for tests that run the demo project's ``manage.py`` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "clean_env", "manage", "python"]


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
