"""docs/quickstart.md, run as written: its commands, in order, in a fresh virtualenv and a
fresh ``django-admin startproject``, so the page cannot fall behind the code.

The script is built from the page's fenced blocks (markers: tests/docs_blocks.py):
every ```` ```bash ```` block runs in order in one ``bash -e`` shell (so ``$TOKEN`` and
the activated virtualenv carry over, as in a reader's terminal); ``append``/``write``
blocks become files at that point; the ``background`` block (the server) is started in
the background and waited for; ``skip`` blocks are not run. One substitution only:
``127.0.0.1:8000`` becomes a free port. "Your checkout" is a copy of this source tree
beside the new project (the page builds the wheel from it). pip resolves the
dependencies from the package index, pinned by requirements-dev.txt as a constraints
file (the helpers of tests/test_packaging.py).

Marked ``slow``, like the wheel test.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .docs_blocks import DOCS, ROOT, blocks
from .test_packaging import constraints, free_port

pytestmark = pytest.mark.slow

QUICKSTART = DOCS / "quickstart.md"
DOC_ADDRESS = "127.0.0.1:8000"
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".nox",
    "dist",
    "build",
    "site",
    "*.egg-info",
    "__pycache__",
    "*.sqlite3",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".env",
)


def quickstart_script(port: int) -> str:
    """The page's blocks as one bash script, in order."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    served = False
    for block in blocks(QUICKSTART):
        text = block.text.replace(DOC_ADDRESS, f"127.0.0.1:{port}")
        if block.action == "skip":
            continue
        if block.action in {"append", "write"}:
            mode = ">>" if block.action == "append" else ">"
            lines += [f"cat {mode} {shlex.quote(block.arg)} <<'QUICKSTART_EOF'", text.rstrip()]
            lines.append("QUICKSTART_EOF")
        elif block.lang == "bash" and block.action == "background":
            served = True
            lines += [
                f"echo '$ {block.where}'",
                f"( {text.strip()} ) > server.log 2>&1 &",
                "for _ in $(seq 300); do",
                f"  curl -s -o /dev/null http://127.0.0.1:{port}/ && break; sleep 0.2",
                "done",
                f"curl -s -o /dev/null http://127.0.0.1:{port}/ || {{ cat server.log; exit 1; }}",
            ]
        elif block.lang == "bash":
            lines += [f"echo '$ {block.where}'", text.rstrip(), "echo"]
    assert served, "the quickstart no longer starts a server"
    return "\n".join(lines) + "\n"


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    # "a checkout of the repository": the source tree as committed, without build output.
    shutil.copytree(ROOT, tmp_path / "django-llm-routing", ignore=NOT_SOURCE)
    port = free_port()
    script = quickstart_script(port)
    (tmp_path / "quickstart.sh").write_text(script)

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    for name in ("DJANGO_SETTINGS_MODULE", "OPENAI_API_KEY"):
        env.pop(name, None)
    # ``python3`` is this interpreter, as it would be the reader's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_CONSTRAINT"] = str(constraints(tmp_path))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(
        ["bash", str(tmp_path / "quickstart.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-4000:]}\n{proc.stderr[-4000:]}"

    # The two requests of "The first request" answered as the page says.
    answers = [json.loads(line) for line in out.splitlines() if line.startswith('{"request_id"')]
    assert len(answers) == 2, out[-4000:]
    by_rule, by_default = answers
    assert by_rule["result"]["provider"] == "staging"
    assert by_rule["result"]["status"] == "ok"
    assert by_rule["routing_metadata"]["router_mode"] == "rule"
    assert by_rule["routing_metadata"]["rule"] == "cheap"
    assert by_default["routing_metadata"]["skipped_providers"] == [
        {"provider": "openai-main", "reason": "missing_key"}
    ]
    assert by_default["routing_metadata"]["fallback_reason"] == "missing_key"
    assert by_default["result"]["provider"] == "staging"
    # The token step printed a token, and the project really is the fresh one.
    assert (tmp_path / "mysite" / "settings.py").read_text().count('"llm_routing"') == 1
    assert "Generated token" not in out  # $TOKEN holds the key itself, not the sentence


def test_the_script_follows_the_page() -> None:
    """Cheap guard (no build): the blocks the test depends on are still there."""
    script = quickstart_script(port=12345)
    assert "127.0.0.1:8000" not in script
    assert "python -m build django-llm-routing" in script
    assert "pip install django-llm-routing/dist/" in script
    assert "django-admin startproject mysite ." in script
    assert "drf_create_token alice" in script and "createsuperuser" in script
    assert "runserver 127.0.0.1:12345" in script
    assert script.index("runserver") < script.index("curl -s -X POST")
