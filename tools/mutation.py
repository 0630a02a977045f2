#!/usr/bin/env python3
"""Mutation testing of the routing core (mutmut), one module at a time.

    .venv/bin/nox -s mutation                              # every core module
    .venv/bin/nox -s mutation -- walk stream breaker       # some modules
    .venv/bin/python tools/mutation.py --changed-since main --whole budget --check  # CI

Each module runs in its own scratch copy of the project (``.mutation/<module>/``) whose
``[tool.mutmut]`` section names only that module and only the test files that exercise
it; mutmut maps each mutated function to the tests that reach it and runs just those
for each of its mutants.

``--changed-since REF`` mutates only the functions (and methods) of each core module
whose code differs from the merge base with REF — a module new since then is mutated
whole (unless its functions moved there unchanged from a file of ``MOVED_FROM``), a
module without changed functions is not run; an unknown REF is an error.
``--whole MODULE`` (repeatable) mutates that module whole even with ``--changed-since``
(the CI floor's fixed sample, so a run on an unchanged main still checks something).
``--check`` fails (exit 1) when a score falls below the module's floor in
``tools/mutation_floors.json``;
``--write-floors`` records the measured scores there. ``--time-budget`` stops the run
after that many seconds and scores the mutants checked so far (reported as partial).

Score = (killed + timed out) / (checked - skipped), as mutmut computes it: a mutant that
no selected test reaches counts as surviving. The survivors judged equivalent (listed by
name in ``tools/mutation_equivalent.txt``, each explained in docs/testing.md) are also
reported as a second score without them, the one ``--check`` compares with the floor.
Each name carries a digest of its function's code: when the function changes, its
entries no longer apply (its survivors must be judged again; ``--list-equivalent``
prints the lines for survivors of the last run). Results go to ``.mutation/results.json``
and each module's survivors to ``.mutation/<module>/survivors.txt``
(``mutmut show <name>`` in that directory prints a survivor's diff). ``--resume``
reruns the survivors and the unchecked mutants; the earlier kills stand, even when mutmut
forgot them because a test file joined the module's selection (:func:`keep_kills`).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
FLOORS = ROOT / "tools" / "mutation_floors.json"
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.txt"

#: What the scratch copy holds (the test settings import the demo project).
COPY = ("llm_routing", "tests", "project", "templates", "manage.py")

#: Test files that pin the core as a whole (added to every module's selection).
CORE_TESTS = [
    "tests/test_core_behaviour.py",
    "tests/test_core_retry.py",
    "tests/test_core_properties.py",
    "tests/test_core_walk.py",
]
#: Core module -> (its file, the test files that exercise it).
MODULES: dict[str, tuple[str, list[str]]] = {
    "retry": (
        "llm_routing/resilience/retry.py",
        ["tests/test_resilience_retry.py", "tests/test_resilience_budget.py"],
    ),
    "budget": (
        "llm_routing/resilience/budget.py",
        ["tests/test_resilience_budget.py", "tests/test_resilience_retry.py"],
    ),
    "breaker": (
        "llm_routing/resilience/breaker.py",
        ["tests/test_breaker.py", "tests/test_breaker_router.py", "tests/test_breaker_adapters.py"],
    ),
    # Not test_router_async.py: mutmut wraps the async generator astream() in one of
    # its own, and a stream dropped by its consumer is then closed by the loop's
    # shutdown through two generators (its cleanup does not run to the end).
    "effects": (
        "llm_routing/effects.py",
        [
            "tests/test_effects.py",
            "tests/test_issue22_core.py",
            "tests/test_router_stream.py",
            "tests/test_hedging.py",
        ],
    ),
    "classify": (
        "llm_routing/providers/classify.py",
        [
            "tests/test_providers_classify.py",
            "tests/test_providers_faults.py",
            "tests/test_core_classify.py",
        ],
    ),
}

#: The test files of the routing core (llm_routing/routing/: plan, walk, stream,
#: explain), each of its modules mutated with all of them.
ROUTING_TESTS = [
    "tests/test_router.py",
    "tests/test_router_stream.py",
    "tests/test_router_upstream.py",
    "tests/test_breaker_router.py",
    "tests/test_explain.py",
    # the async driver's own paths (aroute, aroute_stream, Setup/Record.arun)
    "tests/test_router_async.py",
    "tests/test_router_tools.py",
    "tests/test_hedging.py",  # the walk's hedges (Race: both drivers)
    "tests/test_hedging_stream.py",  # a stream's hedges (both drivers)
    "tests/test_steps_routing.py",  # the steps' order, strategies, affinity, leases
]
MODULES.update(
    {
        "plan": ("llm_routing/routing/plan.py", ROUTING_TESTS),
        "walk": ("llm_routing/routing/walk.py", ROUTING_TESTS),
        "stream": ("llm_routing/routing/stream.py", ROUTING_TESTS),
        "explain": ("llm_routing/routing/explain.py", ROUTING_TESTS),
    }
)

#: Where a core module's functions were before a move: a function there with the
#: same name and the same code (its AST) is not a changed function of the new file.
#: The routing core was llm_routing/router.py before it was split by job.
MOVED_FROM: dict[str, tuple[str, ...]] = {
    path: ("llm_routing/router.py",)
    for path, _ in (MODULES[name] for name in ("plan", "walk", "stream", "explain"))
}

PYTEST_ARGS = [
    "-m",
    "not services and not live and not slow",
    "-p",
    "no:cacheprovider",
    # An HTTP-date Retry-After has 1 s resolution and is read back against the wall
    # clock: under mutmut's tracer on a loaded machine the test's 1 s slack runs out.
    "--deselect",
    "tests/test_resilience_retry.py::test_retry_after_is_honoured_up_to_the_cap[fault_kwargs2-4.0]",
]

# mutmut's exit codes per mutant (mutmut/stats.py); None means not checked yet.
KILLED = {1, 3, 37}
TIMEOUT = {24, -24, 36, 152, 255}
SKIPPED = {34}
NO_TESTS = {5, 33}


@dataclass
class Score:
    module: str
    path: str
    mutants: int
    checked: int
    killed: int
    timeout: int
    survived: int
    no_tests: int
    skipped: int
    score: float
    seconds: float
    equivalent: int = 0  # survivors listed in tools/mutation_equivalent.txt
    score_without_equivalent: float = 100.0
    functions: list[str] = field(default_factory=list)  # empty: the whole module
    partial: bool = False


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(name: str, *, resume: bool = False) -> Path:
    """A fresh scratch copy of the project whose pyproject mutates only ``name``
    (``resume``: mutmut's own state in ``mutants/`` is kept)."""
    path, tests = MODULES[name]
    work = WORK / name
    if work.exists():
        for child in work.iterdir():
            if resume and child.name == "mutants":
                continue
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
    work.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for item in COPY:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, work / item, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, work / item)
    selection = [t for t in [*tests, *CORE_TESTS] if (ROOT / t).exists()]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pyproject += (
        "\n[tool.mutmut]\n"
        'source_paths = ["llm_routing"]\n'
        f"only_mutate = {_toml_list([path])}\n"
        f"also_copy = {_toml_list(['project', 'templates', 'manage.py'])}\n"
        f"pytest_add_cli_args = {_toml_list(PYTEST_ARGS)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(selection)}\n"
        "use_git_change_detection = false\n"
    )
    (work / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    return work


def _mutmut(work: Path, args: list[str], *, timeout: float | None) -> tuple[int, str, bool]:
    """Run mutmut in ``work``; on timeout the whole process group is stopped."""
    exe = Path(sys.executable).with_name("mutmut")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMR_TEST_")}
    proc = subprocess.Popen(  # noqa: S603 - our own venv's mutmut, fixed arguments
        [str(exe), *args],
        cwd=work,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return proc.returncode, out, True


def _mutated(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether mutmut mutates this function: not when it is decorated (a property
    included), except by a lone ``@staticmethod`` or ``@classmethod``."""
    decorators = node.decorator_list
    if not decorators:
        return True
    only = decorators[0]
    return (
        len(decorators) == 1
        and isinstance(only, ast.Name)
        and only.id in ("staticmethod", "classmethod")
    )


def function_names(source: str) -> dict[str, str]:
    """mutmut's name for each function and method of a module that mutmut mutates ->
    a dump of its code."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _mutated(node):
                out[f"x_{node.name}"] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _mutated(item):
                    out[f"x\u01c1{node.name}\u01c1{item.name}"] = ast.dump(item)
    return out


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        ["git", *args],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def changed_functions(path: str, base: str) -> list[str] | None:
    """The functions of ``path`` changed since the merge base with ``base``: None means
    the whole module (new, or no merge base), [] means nothing changed. A function
    moved here unchanged (same name, same code, in a file of :data:`MOVED_FROM` at the
    merge base) is not changed: a pure move mutates nothing."""
    merge_base = _git("merge-base", "HEAD", base)
    if merge_base.returncode != 0:
        return None
    before: dict[str, str] = {}
    found = False
    for old_path in (path, *MOVED_FROM.get(path, ())):
        old = _git("show", f"{merge_base.stdout.strip()}:{old_path}")
        if old.returncode == 0:
            found = True
            before = {**function_names(old.stdout), **before}
    if not found:
        return None
    now = function_names((ROOT / path).read_text(encoding="utf-8"))
    return sorted(name for name, code in now.items() if before.get(name) != code)


def _exit_codes(work: Path, path: str) -> dict[str, int | None]:
    meta = work / "mutants" / (path + ".meta")
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def _meta(work: Path, path: str) -> dict[str, Any]:
    meta = work / "mutants" / (path + ".meta")
    return json.loads(meta.read_text()) if meta.exists() else {}


def keep_kills(work: Path, path: str, before: dict[str, Any]) -> int:
    """Write back the kills of ``before`` (a module's mutmut state before a ``--resume``
    run) that the run left unchecked; how many. mutmut forgets every verdict when a
    module's test selection changes (a test file added to it), and a resumed run only
    reruns the survivors: the earlier kills stand (only tests were added since), except
    in a function whose code changed."""
    meta = work / "mutants" / (path + ".meta")
    if not before or not meta.exists():
        return 0
    now = json.loads(meta.read_text())
    codes: dict[str, int | None] = now["exit_code_by_key"]
    old_hashes = before.get("hash_by_function_name", {})
    new_hashes = now.get("hash_by_function_name", {})
    kept = 0
    for key, code in before.get("exit_code_by_key", {}).items():
        function = key.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
        if codes.get(key, 0) is not None or code not in KILLED | TIMEOUT:
            continue
        if old_hashes.get(function) != new_hashes.get(function):
            continue
        codes[key] = code
        kept += 1
    if kept:
        meta.write_text(json.dumps(now, indent=4))
    return kept


def run_module(
    name: str,
    *,
    functions: list[str] | None,
    children: int,
    budget: float | None,
    resume: bool = False,
) -> Score:
    path = MODULES[name][0]
    dotted = path.removesuffix(".py").replace("/", ".")
    patterns = [f"{dotted}.{f}__mutmut_*" for f in functions or []]
    work = prepare(name, resume=resume)
    what = ", ".join(functions) if functions else "whole module"
    to_run = patterns
    before: dict[str, Any] = {}
    if resume:  # rerun what survived and finish what was not checked; kills stand
        before = _meta(work, path)
        previous = _exit_codes(work, path)
        to_run = sorted(k for k, v in previous.items() if v not in KILLED | TIMEOUT | SKIPPED)
        if patterns:
            to_run = [k for k in to_run if any(fnmatch.fnmatch(k, p) for p in patterns)]
        what += f", resumed: {len(to_run)} mutants rerun"
    print(f"== mutation: {path} ({what}) ==", flush=True)
    started = time.monotonic()
    args = ["run", "--max-children", str(children), *to_run]
    code, out, stopped = _mutmut(work, args, timeout=budget)
    seconds = time.monotonic() - started
    # mutmut draws a progress spinner with carriage returns: keep each line's last frame.
    log = "\n".join(line.rsplit("\r", 1)[-1] for line in out.splitlines())
    (work / "mutmut-run.log").write_text(log + "\n")
    keep_kills(work, path, before)
    exits = _exit_codes(work, path)
    if patterns and code != 0 and "nothing matches" in log:  # no mutant in those functions
        print(f"{path}: no mutant in {what}", flush=True)
        return Score(name, path, 0, 0, 0, 0, 0, 0, 0, 100.0, round(seconds, 1), 0, 100.0,
                     functions or [])  # fmt: skip
    if (code != 0 and not stopped) or not exits:
        print(log[-4000:], file=sys.stderr)
        raise SystemExit(f"mutmut run failed for {path} (exit {code})")
    if patterns:
        exits = {k: v for k, v in exits.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
    checked = {k: v for k, v in exits.items() if v is not None}
    killed = sum(v in KILLED for v in checked.values())
    timeout = sum(v in TIMEOUT for v in checked.values())
    skipped = sum(v in SKIPPED for v in checked.values())
    no_tests = sum(v in NO_TESTS for v in checked.values())
    tested = len(checked) - skipped
    score = Score(
        module=name,
        path=path,
        mutants=len(exits),
        checked=len(checked),
        killed=killed,
        timeout=timeout,
        survived=tested - killed - timeout - no_tests,
        no_tests=no_tests,
        skipped=skipped,
        score=round(100.0 * (killed + timeout) / tested, 1) if tested else 100.0,
        seconds=round(seconds, 1),
        functions=functions or [],
        partial=len(checked) < len(exits),
    )
    survivors = sorted(k for k, v in checked.items() if v not in KILLED | TIMEOUT | SKIPPED)
    known = _equivalent(path) & set(survivors)
    score.equivalent = len(known)
    rest = tested - len(known)
    score.score_without_equivalent = round(100.0 * (killed + timeout) / rest, 1) if rest else 100.0
    (work / "survivors.txt").write_text("".join(s + "\n" for s in survivors))
    note = (
        f", stopped at the time budget: {len(checked)} of {len(exits)} checked" if stopped else ""
    )
    print(
        f"{path}: {score.score:.1f} % ({killed + timeout} of {tested} killed, "
        f"{score.survived} survived, {no_tests} reached by no test; "
        f"{score.score_without_equivalent:.1f} % without the {len(known)} known equivalent) "
        f"in {seconds:.0f} s{note}",
        flush=True,
    )
    return score


def function_digest(path: str, mutant: str) -> str | None:
    """A short digest of the code of the function ``mutant`` belongs to (None: gone)."""
    function = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    code = function_names((ROOT / path).read_text(encoding="utf-8")).get(function)
    return None if code is None else hashlib.sha256(code.encode()).hexdigest()[:12]


def _equivalent(path: str) -> set[str]:
    """The listed equivalent mutants of ``path`` whose function is unchanged."""
    if not EQUIVALENT.exists():
        return set()
    dotted = path.removesuffix(".py").replace("/", ".") + "."
    out = set()
    for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith(dotted):
            if function_digest(path, parts[0]) == parts[1]:
                out.add(parts[0])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--changed-since", metavar="REF", help="only code changed since REF")
    parser.add_argument("--check", action="store_true", help="fail below the recorded floors")
    parser.add_argument("--write-floors", action="store_true", help="record scores as floors")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant workers")
    parser.add_argument("--time-budget", type=float, help="seconds for the whole run")
    parser.add_argument(
        "--function",
        action="append",
        default=[],
        metavar="NAME",
        help="only this function (x_resolve) or method (x\u01c1Class\u01c1name); repeatable",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the last run's results: rerun only survivors and unchecked mutants "
        "(valid when tests were only added since)",
    )
    parser.add_argument(
        "--whole",
        action="append",
        default=[],
        metavar="MODULE",
        help="mutate this module whole even with --changed-since; repeatable",
    )
    parser.add_argument(
        "--list-equivalent",
        metavar="MODULE",
        help="print the last run's survivors of MODULE as lines for mutation_equivalent.txt",
    )
    args = parser.parse_args(argv)
    if args.list_equivalent:
        path = MODULES[args.list_equivalent][0]
        for name in (WORK / args.list_equivalent / "survivors.txt").read_text().split():
            print(name, function_digest(path, name))
        return 0
    unknown = sorted((set(args.modules) | set(args.whole)) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")

    if args.changed_since and _git("rev-parse", "--verify", "-q", args.changed_since).returncode:
        parser.error(f"--changed-since {args.changed_since}: no such commit in this clone")
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    floors: dict[str, float] = json.loads(FLOORS.read_text()) if FLOORS.exists() else {}
    results: list[Score] = []
    failed: list[str] = []
    for name in args.modules or list(MODULES):
        functions = args.function or None
        if args.changed_since and name not in args.whole:
            functions = changed_functions(MODULES[name][0], args.changed_since)
            if functions == []:
                print(f"== mutation: {MODULES[name][0]}: unchanged since {args.changed_since} ==")
                continue
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 60:
            print(f"== mutation: {MODULES[name][0]}: not run, the time budget is spent ==")
            continue
        score = run_module(
            name,
            functions=functions,
            children=args.max_children,
            budget=left,
            resume=args.resume,
        )
        results.append(score)
        floor = floors.get(name)
        measured = score.score_without_equivalent
        if args.check and floor is not None and measured < floor:
            failed.append(
                f"{score.path}: {measured:.1f} % (without the known equivalent mutants) "
                f"is below its floor {floor:.1f} %"
            )
    WORK.mkdir(exist_ok=True)
    (WORK / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    if args.write_floors:
        floors.update(
            {
                r.module: r.score_without_equivalent
                for r in results
                if not (r.functions or r.partial)
            }
        )
        FLOORS.write_text(json.dumps(dict(sorted(floors.items())), indent=2) + "\n")
    for message in failed:
        print(f"MUTATION FLOOR: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
