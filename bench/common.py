"""Pieces shared by the benchmark scripts: interleaved sampling and docs sections."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["interleaved_samples", "replace_docs_section"]


def interleaved_samples(
    variants: Mapping[str, Callable[[], float]], *, rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Run every variant ``warmup`` times, then ``rounds`` rounds in a shuffled order (so
    no variant always runs right after a heavy one); each call returns its sample."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffler = random.Random(0)
    for _ in range(rounds):
        shuffler.shuffle(order)
        for name in order:
            samples[name].append(variants[name]())
    return samples


def replace_docs_section(
    path: Path, begin: str, end: str, block: str, *, append_if_missing: bool = True
) -> None:
    """Replace the ``begin``…``end`` block of ``path`` with ``block`` (which carries the
    markers); append it when absent, or refuse when ``append_if_missing`` is false."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    elif append_if_missing:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        raise SystemExit(f"{path} has no {begin} … {end} block to update")
    path.write_text(text)
    print(f"wrote {path}")
