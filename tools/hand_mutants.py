#!/usr/bin/env python3
"""The survivors issue 17 lists, applied by hand: each is checked to be killed.

    .venv/bin/python tools/hand_mutants.py              # every mutant in hand_mutants.json
    .venv/bin/python tools/hand_mutants.py pump_bug_none probe_slot_no_timeout

Each entry of ``tools/hand_mutants.json`` names a file, an exact text and its
replacement (the mutant) and the test files to run. The mutant is applied to a scratch
copy of the project (``.mutation/hand/``), the tests run there, the copy is restored.
A mutant is killed when the tests fail; the failing tests are printed. Exit 1 when a
mutant survives or its text is not found (the code moved: update the entry).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation" / "hand"
MUTANTS = Path(__file__).with_name("hand_mutants.json")
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
PYTEST += ["-m", "not services and not live and not slow"]
SKIP = (".venv", ".mutation", ".git", ".nox", ".hypothesis", "__pycache__", "site")


def main(argv: list[str]) -> int:
    mutants = json.loads(MUTANTS.read_text(encoding="utf-8"))
    wanted = set(argv)
    if WORK.exists():
        shutil.rmtree(WORK)
    shutil.copytree(ROOT, WORK, ignore=shutil.ignore_patterns(*SKIP))
    bad = 0
    for mutant in mutants:
        if wanted and mutant["id"] not in wanted:
            continue
        path = WORK / mutant["file"]
        original = path.read_text(encoding="utf-8")
        found = original.count(mutant["old"])
        if found != mutant.get("count", 1):
            print(f"{mutant['id']}: NOT FOUND ({found} matches)", flush=True)
            bad += 1
            continue
        path.write_text(original.replace(mutant["old"], mutant["new"]), encoding="utf-8")
        try:
            out = subprocess.run(  # noqa: S603 - our own venv's pytest, fixed arguments
                [*PYTEST, *mutant["tests"]],
                cwd=WORK,
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            path.write_text(original, encoding="utf-8")
        failed = re.findall(r"^FAILED (\S+)", out.stdout, re.MULTILINE)
        killed = out.returncode == 1 and failed
        bad += not killed
        verdict = (
            "killed by " + ", ".join(failed) if killed else f"SURVIVED (exit {out.returncode})"
        )
        print(f"{mutant['id']}: {verdict}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
