"""Support matrix: the embedded suite (the fresh-project wheel test included) per
Python x Django pair, and the services suite on the newest Django.

    .venv/bin/nox                                  # every default session
    .venv/bin/nox -s "tests(py3.13-django6.1)"     # one session
    .venv/bin/nox -s "tests(py3.11-django5.2)" -- -m "not slow" -x   # pytest arguments
    .venv/bin/nox -s "services(py3.13-django6.1)"  # PostgreSQL / Redis / RabbitMQ suite

Each session builds its own virtualenv in .nox/ from requirements-dev.txt, then
installs the session's Django over the pin. Interpreters are found on PATH
(``python3.13``) or, failing that, in pyenv's versions directory; ``NOX_PYTHON_3_13``
(any ``NOX_PYTHON_<major>_<minor>``) names one explicitly.

The matrix is what ``pyproject.toml`` declares: Django 5.2 LTS on Python 3.11 and 3.13,
Django 6.0 and 6.1 on Python 3.12 and 3.13 (Django 6 needs Python 3.12 or newer).
``.ci/run`` runs two of these sessions besides its own Python 3.11 + Django 5.2 run
(docs/operations.md, "Support matrix", says which and why).

``nox -s mutation`` (not part of the default sessions: it takes a long time) runs mutation
testing of the routing core, tools/mutation.py, with its arguments after ``--``
(docs/testing.md).
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
MATRIX: list[tuple[str, str]] = [
    ("3.11", "5.2"),
    ("3.13", "5.2"),
    ("3.12", "6.0"),
    ("3.13", "6.0"),
    ("3.12", "6.1"),
    ("3.13", "6.1"),
]
#: The services suite (real PostgreSQL, Redis, RabbitMQ): the newest Django, and the LTS.
SERVICES_MATRIX: list[tuple[str, str]] = [("3.13", "6.1"), ("3.11", "5.2")]


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


def _install(session: nox.Session, django: str) -> None:
    session.install("-r", "requirements-dev.txt")
    session.install(f"Django~={django}.0")
    session.run("python", "-c", "import django, sys; print(sys.version, django.get_version())")


@nox.session
@nox.parametrize(
    ("python", "django"),
    [(interpreter(py), dj) for py, dj in MATRIX],
    ids=[f"py{py}-django{dj}" for py, dj in MATRIX],
)
def tests(session: nox.Session, django: str) -> None:
    """The embedded suite (SQLite, LocMem, eager Celery) on one Python x Django pair."""
    _install(session, django)
    session.run("python", "-m", "pytest", "-m", "not services and not live", *session.posargs)


@nox.session(default=False)
@nox.parametrize(
    ("python", "django"),
    [(interpreter(py), dj) for py, dj in SERVICES_MATRIX],
    ids=[f"py{py}-django{dj}" for py, dj in SERVICES_MATRIX],
)
def services(session: nox.Session, django: str) -> None:
    """The services suite (``dev.py test --services``) on one Python x Django pair; the
    services must be running (``.ci/services.sh``); ``LLMR_TEST_DATABASE_URL`` /
    ``LLMR_TEST_REDIS_URL`` pass through."""
    _install(session, django)
    session.run(
        "python", "-m", "pytest", "-p", "tests.services_plugin", "-m", "services", *session.posargs
    )


@nox.session(python=interpreter("3.11"), default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the routing core (mutmut): ``nox -s mutation -- [modules]
    [--changed-since REF] [--check] [--max-children N] [--time-budget S]``."""
    session.install("-r", "requirements-dev.txt")
    session.run("python", "tools/mutation.py", *session.posargs)
