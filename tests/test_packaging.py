"""Packaging: the sdist and wheel hold the app and nothing else, and the wheel works in a
brand-new Django project (fresh virtualenv, ``django-admin startproject``, migrate,
config file, Python API, ``POST /audit/`` over a live ``runserver``).

The fresh virtualenv installs the wheel with pip from the package index, pinned by
``requirements-dev.txt`` used as a constraints file, so it sees exactly what a user's
``pip install django-llm-routing`` sees (no --system-site-packages, no source tree on
the path). pip's cache makes repeated runs fast. Marked ``slow``: part of the embedded
suite (and so of CI and every nox session), deselect with ``-m "not slow"`` while
iterating.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "llm_routing"
FOREIGN = (
    "project/", "tests/", "bench/", "fuzz/", "docs/", "templates/", "manage.py", "dev.py",
)  # fmt: skip

ROUTING_TOML = """
version = 1

[providers.staging]
kind = "mock"
model = "staging-1"

[providers.vendor]
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "FRESH_PROJECT_UNSET_KEY"

[chains.main]
is_default = true
entries = ["vendor", "staging"]

[chains.cheap]
entries = ["staging"]

[rules.cheap]
priority = 10
route = "cheap"
chain = "cheap"
"""

SETTINGS_TAIL = """
INSTALLED_APPS += [
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "llm_routing",
]
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
LLM_ROUTING = {"MAX_INPUT_CHARS": 50_000}
"""

URLS_TAIL = """
from django.urls import include

urlpatterns += [path("llm/", include("llm_routing.urls"))]
"""

API_SCRIPT = """
import json
from llm_routing import audit
from llm_routing.types import RoutingResult
r = audit(task="summarize", input_text="Hello from a fresh project.")
assert isinstance(r, RoutingResult), type(r)
import llm_routing
print(json.dumps({"file": llm_routing.__file__, "envelope": r.to_dict()}))
"""

TOKEN_SCRIPT = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
user = get_user_model().objects.create_user("fresh", password="not-used-0123")
print(Token.objects.create(user=user).key)
"""


def app_files() -> set[str]:
    """Every file of the app in the source tree (what both archives must carry)."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in APP.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".pyo"}
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("*.whl"))
    sdists = list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_wheel_holds_the_app_and_nothing_else(dist: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    payload = {n for n in names if ".dist-info/" not in n}
    assert payload == app_files()
    assert "llm_routing/migrations/0001_initial.py" in payload
    assert "llm_routing/py.typed" in payload
    assert any(n.startswith("llm_routing/management/commands/llm_routing_apply") for n in payload)
    assert not [n for n in names if n.startswith(FOREIGN)]


def test_wheel_declares_runtime_dependencies(dist: dict[str, Path]) -> None:
    wheel = zipfile.ZipFile(dist["wheel"])
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [
        line.split(":", 1)[1].strip().lower()
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    for dependency in ("django", "djangorestframework", "drf-spectacular", "httpx", "tomli-w"):
        assert any(r.startswith(dependency) for r in requires), dependency


def test_sdist_holds_the_app_and_nothing_of_the_demo(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert app_files() <= names
    assert "pyproject.toml" in names
    assert not [n for n in names if n.startswith(FOREIGN)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def constraints(tmp: Path) -> Path:
    """requirements-dev.txt as a pip constraints file (extras are not allowed there)."""
    lines = []
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            lines.append(f"{name.split('[', 1)[0]}=={version}")
    path = tmp / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def fresh_project(
    dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("fresh")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("FRESH_PROJECT_UNSET_KEY", None)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(constraints(tmp)),
            str(dist["wheel"]),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    (tmp / "site").mkdir()
    subprocess.run(
        [str(env_dir / "bin" / "django-admin"), "startproject", "hostsite", str(tmp / "site")],
        env=env,
        check=True,
        timeout=120,
    )
    site = tmp / "site"
    with (site / "hostsite" / "settings.py").open("a") as fh:
        fh.write(SETTINGS_TAIL)
    with (site / "hostsite" / "urls.py").open("a") as fh:
        fh.write(URLS_TAIL)
    (site / "routing.toml").write_text(ROUTING_TOML)
    env["FRESH_PYTHON"] = str(python)
    yield site, env


def manage(site: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [env["FRESH_PYTHON"], "manage.py", *args],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, f"manage.py {' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_in_a_fresh_project(fresh_project: tuple[Path, dict[str, str]]) -> None:
    site, env = fresh_project
    manage(site, env, "migrate", "--noinput", "-v", "0")
    checked = manage(site, env, "check", "--database", "default")
    assert "llm_routing.I001" in checked.stderr  # migrated, nothing configured yet

    applied = manage(site, env, "llm_routing_apply", "routing.toml")
    assert "+ provider staging" in applied.stdout and "5 row(s) changed." in applied.stdout
    assert "No changes" in manage(site, env, "llm_routing_apply", "routing.toml").stdout
    exported = manage(site, env, "llm_routing_export").stdout
    (site / "exported.toml").write_text(exported)
    assert "No changes" in manage(site, env, "llm_routing_apply", "exported.toml").stdout

    # The Python API, from the installed wheel (not the source tree).
    api = json.loads(manage(site, env, "shell", "-c", API_SCRIPT).stdout.strip().splitlines()[-1])
    assert "site-packages" in api["file"] and str(ROOT) not in api["file"]
    meta = api["envelope"]["routing_metadata"]
    assert meta["chain_name"] == "main"
    assert meta["skipped_providers"][0]["provider"] == "vendor"
    assert meta["selected_provider"] == "staging"

    token = manage(site, env, "shell", "-c", TOKEN_SCRIPT).stdout.strip().splitlines()[-1]
    port = free_port()
    server = subprocess.Popen(
        [env["FRESH_PYTHON"], "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=site,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "runserver did not start within 60 s"
                time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=30) as client:
            unauthenticated = client.post("/llm/audit/", json={"task": "t", "input_text": "x"})
            assert unauthenticated.status_code in {401, 403}
            headers = {"Authorization": f"Token {token}"}
            response = client.post(
                "/llm/audit/",
                json={"task": "summarize", "input_text": "Over HTTP.", "route": "cheap"},
                headers=headers,
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert response.headers["X-Request-ID"] == body["request_id"]
            assert body["routing_metadata"]["router_mode"] == "rule"
            assert body["routing_metadata"]["rule"] == "cheap"
            assert body["result"]["provider"] == "staging"
            assert body["result"]["status"] == "ok"
            bad = client.post("/llm/audit/", json={"task": "t"}, headers=headers)
            assert bad.status_code == 400 and "input_text" in bad.json()
            schema = client.get("/llm/api/schema/")
            assert schema.status_code == 200 and "/llm/audit/" in schema.text
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
