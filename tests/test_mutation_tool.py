"""tools/mutation.py's ``--resume``: the kills of the run before stand when mutmut has
forgotten them (it resets every verdict when a module's test selection changes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PATH = "llm_routing/routing/walk.py"
F = "llm_routing.routing.walk.x_order_step__mutmut_"
G = "llm_routing.routing.walk.xǁ_Sessionǁ_hedge__mutmut_"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "mutation_tool", Path(__file__).parent.parent / "tools" / "mutation.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def meta(codes: dict[str, int | None], hashes: dict[str, str]) -> dict[str, Any]:
    return {"exit_code_by_key": codes, "hash_by_function_name": hashes, "durations_by_key": {}}


def test_a_resumed_run_keeps_the_kills_mutmut_forgot(tool: ModuleType, tmp_path: Path) -> None:
    before = meta(
        {F + "1": 1, F + "2": 0, F + "3": 24, G + "1": 1, G + "2": 1},
        {"x_order_step": "same", "xǁ_Sessionǁ_hedge": "old"},
    )
    after = meta(
        # mutmut forgot everything, then reran the survivor F2 (now killed)
        {F + "1": None, F + "2": 1, F + "3": None, G + "1": None, G + "2": 0},
        {"x_order_step": "same", "xǁ_Sessionǁ_hedge": "new"},
    )
    file = tmp_path / "mutants" / (PATH + ".meta")
    file.parent.mkdir(parents=True)
    file.write_text(json.dumps(after))
    assert tool.keep_kills(tmp_path, PATH, before) == 2
    codes = json.loads(file.read_text())["exit_code_by_key"]
    # F1 (killed) and F3 (timed out) stand; G1's function changed: checked afresh.
    assert codes == {F + "1": 1, F + "2": 1, F + "3": 24, G + "1": None, G + "2": 0}
    assert tool.keep_kills(tmp_path, PATH, {}) == 0


def test_the_changed_functions_are_those_mutmut_mutates(tool: ModuleType) -> None:
    # mutmut leaves decorated functions alone (a property included), except under a
    # lone @staticmethod or @classmethod: asking it for a property's mutants fails the
    # run ("nothing matches"), as CI's step did after a property changed.
    source = """
import functools

def plain(): return 1

@functools.cache
def cached(): return 2

class Step:
    def method(self): return 3

    @property
    def applied(self): return 4

    @staticmethod
    def static(): return 5

    @classmethod
    def build(cls): return 6

    @staticmethod
    @functools.cache
    def both(): return 7
"""
    assert sorted(tool.function_names(source)) == sorted(
        ["x_plain", "xǁStepǁmethod", "xǁStepǁstatic", "xǁStepǁbuild"]
    )
