"""Support matrix: the embedded suite (the fresh-project wheel test included) per
Python x Django pair.

    .venv/bin/nox                                  # every session
    .venv/bin/nox -s "tests(py3.13-django5.2)"     # one session
    .venv/bin/nox -s "tests(py3.11-django5.2)" -- -m "not slow" -x   # pytest arguments

Each session builds its own virtualenv in .nox/ from requirements-dev.txt, then
installs the session's Django over the pin. Interpreters are found on PATH
(``python3.13``) or, failing that, in pyenv's versions directory; ``NOX_PYTHON_3_13``
(any ``NOX_PYTHON_<major>_<minor>``) names one explicitly.

``nox -s mutation`` (not part of the default sessions: it takes a long time) runs mutation
testing of the routing core, tools/mutation.py, with its arguments after ``--``
(docs/testing.md).

The package index used here carries no Django 6 release yet, so the Python 3.13
session runs Django 5.2 too: when Django 6 is available, change its entry in MATRIX to
"6.0" (pyproject already allows Django < 7).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.download_python = "never"  # only interpreters installed on the machine
nox.options.error_on_missing_interpreters = True

# (Python version, Django release series)
MATRIX: list[tuple[str, str]] = [("3.11", "5.2"), ("3.13", "5.2")]


def interpreter(version: str) -> str:
    """A working ``pythonX.Y``: env override, PATH, then pyenv's versions directory."""
    override = os.environ.get(f"NOX_PYTHON_{version.replace('.', '_')}")
    if override:
        return override
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(
        (str(p) for p in pyenv_root.glob(f"versions/{version}*/bin/python{version}")),
        reverse=True,
    )
    for candidate in candidates:
        if candidate and _runs(candidate, version):
            return candidate
    return version  # let nox report the missing interpreter


def _runs(path: str, version: str) -> bool:
    try:
        out = subprocess.run(  # noqa: S603 - a local interpreter, fixed arguments
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


@nox.session
@nox.parametrize(
    ("python", "django"),
    [(interpreter(py), dj) for py, dj in MATRIX],
    ids=[f"py{py}-django{dj}" for py, dj in MATRIX],
)
def tests(session: nox.Session, django: str) -> None:
    """The embedded suite (SQLite, LocMem, eager Celery) on one Python x Django pair."""
    session.install("-r", "requirements-dev.txt")
    session.install(f"Django~={django}.0")
    session.run("python", "-c", "import django, sys; print(sys.version, django.get_version())")
    session.run("python", "-m", "pytest", "-m", "not services and not live", *session.posargs)


@nox.session(python=interpreter("3.11"), default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the routing core (mutmut): ``nox -s mutation -- [modules]
    [--changed-since REF] [--check] [--max-children N] [--time-budget S]``."""
    session.install("-r", "requirements-dev.txt")
    session.run("python", "tools/mutation.py", *session.posargs)
