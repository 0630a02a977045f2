"""README.md's examples, run as written against the demo as ``python3 dev.py demo`` serves it.

The demo project is started the way dev.py does it — ``migrate``, ``seed_demo --port``,
``runserver`` — in a subprocess with a fresh SQLite file and ``DEBUG=true``, on a free
port. The API token is read from seed_demo's own printout (the line a newcomer copies).
Then README's fenced examples run unchanged but for two substitutions: the port
(``127.0.0.1:8000`` → the free port) and the token placeholders (``<printed token>``,
``<DRF token>``). The curl block runs in ``bash``; the OpenAI-SDK block runs with the
``openai`` package; the ``chat()`` block runs in-process against a database seeded by
the same command. The Python blocks marked ``run`` are covered by test_docs_snippets.py.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from django.core.management import call_command
from django.test import override_settings

from .docs_blocks import ROOT, Block, blocks
from .support import clean_env, free_port, manage

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
DOC_ADDRESS = "127.0.0.1:8000"


def readme_block(lang: str, needle: str) -> Block:
    found = [b for b in blocks(README) if b.lang == lang and needle in b.text]
    assert len(found) == 1, f"README.md has {len(found)} {lang} blocks containing {needle!r}"
    return found[0]


def as_written(block: Block, port: int, token: str) -> str:
    text = block.text.replace(DOC_ADDRESS, f"127.0.0.1:{port}")
    return text.replace("<printed token>", token).replace("<DRF token>", token)


class Demo:
    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("demo")
    env = clean_env(
        DEBUG="true",
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{folder / 'db.sqlite3'}",
    )
    port = free_port()
    migrated = manage("migrate", "--noinput", env=env, timeout=300)
    assert migrated.returncode == 0, migrated.stderr
    seeded = manage("seed_demo", "--port", str(port), env=env)
    assert seeded.returncode == 0, seeded.stderr
    token = re.search(r"^API token: (\w+)$", seeded.stdout, re.MULTILINE)
    assert token, seeded.stdout
    assert f"curl -s -X POST http://127.0.0.1:{port}/audit/" in seeded.stdout
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/schema/", timeout=5)
                break
            except httpx.TransportError:
                assert server.poll() is None, "the demo server exited"
                assert time.monotonic() < deadline, "the demo server did not start"
                time.sleep(0.3)
        yield Demo(port, token[1])
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_readme_curl_answers_as_the_readme_shows(demo: Demo) -> None:
    block = readme_block("bash", "/audit/")
    run = subprocess.run(
        ["bash", "-e", "-c", as_written(block, demo.port, demo.token)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    assert body["result"]["provider"] == "mock" and body["result"]["status"] == "ok"
    meta = body["routing_metadata"]
    assert meta["chain_name"] == "default"
    assert meta["skipped_providers"] == [
        {"provider": "openai-main", "reason": "missing_key"},
        {"provider": "anthropic", "reason": "disabled"},
    ]
    # Every key of the README's sample answer is in the real one, and no more.
    sample = readme_block("json", '"routing_metadata"').text
    sample_keys = set(re.findall(r'"(\w+)":', sample)) - {"…"}
    real_keys = set(body) | set(body["result"]) | set(body["result"]["usage"])
    real_keys |= set(meta) | set(meta["attempts"][0])
    assert sample_keys <= real_keys | {"provider", "reason"}
    assert real_keys - sample_keys == set()


def test_readme_openai_sdk_example_answers_on_the_demo(demo: Demo) -> None:
    block = readme_block("python", "from openai import OpenAI")
    namespace: dict[str, object] = {"__name__": "readme_openai"}
    exec(compile(as_written(block, demo.port, demo.token), block.where, "exec"), namespace)
    answer = namespace["answer"]
    assert answer.choices[0].message.content.startswith("[mock] chat:")  # type: ignore[attr-defined]
    assert answer.model == "mock-1"  # type: ignore[attr-defined]


def test_the_printed_curl_line_answers(demo: Demo) -> None:
    """The curl line seed_demo prints (the one README tells you to paste)."""
    response = httpx.post(
        f"http://127.0.0.1:{demo.port}/audit/",
        headers={"Authorization": f"Token {demo.token}"},
        json={"task": "summarize", "input_text": "Django is a web framework."},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.json()["result"]["status"] == "ok"


@pytest.mark.django_db
def test_readme_chat_example_runs_on_the_seeded_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_OPENAI_API_KEY", raising=False)
    with override_settings(DEBUG=True):
        call_command("seed_demo", stdout=io.StringIO())
    block = readme_block("python", "from llm_routing import chat")
    namespace: dict[str, object] = {"__name__": "readme_chat"}
    exec(compile(block.text, block.where, "exec"), namespace)
    routed = namespace["routed"]
    assert routed.metadata.chain_name == "default"  # type: ignore[attr-defined]
    assert routed.result.status == "ok"  # type: ignore[attr-defined]
