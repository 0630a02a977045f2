#!/usr/bin/env python3
"""Bootstrap and run the project from nothing but Python 3.11+.

    python3 dev.py demo     # virtualenv + deps, migrate, seed, serve http://127.0.0.1:8000/
    python3 dev.py test     # virtualenv + deps, the embedded test suite (SQLite, LocMem)
    python3 dev.py test --services   # the suite marked "services" (PostgreSQL, Redis, RabbitMQ)
    python3 dev.py lint     # ruff + mypy

Extra arguments after ``test`` go to pytest. The virtualenv lives in ``.venv`` and is
re-synced whenever requirements-dev.txt changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
REQUIREMENTS = ROOT / "requirements-dev.txt"
STAMP = VENV / ".requirements.sha256"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv() -> Path:
    python = venv_python()
    if not python.exists():
        print(f"Creating virtualenv in {VENV} …", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text().strip() != digest:
        print("Installing requirements-dev.txt …", flush=True)
        run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        run([str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)])
        STAMP.write_text(digest)
    return python


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(cmd, cwd=ROOT, env=env, check=False)  # noqa: S603
    if result.returncode != 0:
        sys.exit(result.returncode)


def demo(args: list[str]) -> None:
    python = ensure_venv()
    env = dict(os.environ)
    env.setdefault("DEBUG", "true")
    port = args[0] if args else "8000"
    run([str(python), "manage.py", "migrate", "--noinput"], env)
    run([str(python), "manage.py", "seed_demo", "--port", port], env)
    print(f"\nServing the demo on http://127.0.0.1:{port}/ (Ctrl-C stops it)\n", flush=True)
    os.chdir(ROOT)
    os.execve(str(python), [str(python), "manage.py", "runserver", f"127.0.0.1:{port}"], env)  # noqa: S606


def test(args: list[str]) -> None:
    python = ensure_venv()
    if "--services" in args:
        args = [a for a in args if a != "--services"]
        # PostgreSQL + Redis settings, and the API modules marked "services" too.
        marker = ["-p", "tests.services_plugin", "-m", "services"]
    else:
        marker = ["-m", "not services and not live"]
    run([str(python), "-m", "pytest", *marker, *args])


def lint(args: list[str]) -> None:
    python = ensure_venv()
    run([str(python), "-m", "ruff", "check", "."])
    run([str(python), "-m", "ruff", "format", "--check", "."])
    run([str(python), "-m", "mypy", "llm_routing", "project"])


COMMANDS = {"demo": demo, "test": test, "lint": lint}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](sys.argv[2:])
