"""Request serializers reused per thread instead of built per request.

DRF builds a serializer's fields on every instance by deep-copying the declared fields
(``Serializer.get_fields``), nested serializers and their fields included; for the
``/v1/chat/completions`` body that copy cost more than validating the data (measured:
docs/benchmarks.md). :func:`reused` keeps one instance per serializer class per thread
and hands it out with fresh data and none of the last request's results. Safe because
validation is synchronous: on an event loop no other request runs between ``is_valid``
and the last read of ``validated_data`` (nothing awaits in between), and worker threads
each have their own instance. The fields keep no per-request state (DRF's and this
app's), and ``context`` is not used by the reused serializers.

The results DRF caches on an instance (``_validated_data``, ``_errors``, ``_data``) are
private: a guard (:mod:`llm_routing.seams`, W026) runs a probe serializer through a
whole validation at first use and checks that DRF cached nothing else on it. A DRF that
caches something new would carry one request's data into the next; then every request
gets a new serializer, as DRF intends, and the system check says so.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rest_framework import serializers
from rest_framework.serializers import Serializer

from .. import seams

__all__ = ["reused"]

S = TypeVar("S", bound=Serializer)

_local = threading.local()

#: What ``is_valid`` / ``validated_data`` / ``errors`` / ``data`` leave on an instance.
_RESULTS = ("_validated_data", "_errors", "_data")
#: What DRF caches on an instance that holds no request data (kept on reuse).
_SHAPE = frozenset({"fields", "_validators"})


@seams.register(
    "W026",
    "DRF caching a serializer's results only in _validated_data / _errors / _data",
    "every request builds a new serializer (DRF's own way)",
)
def _probe_results() -> str | None:
    class Probe(serializers.Serializer):
        number = serializers.IntegerField()
        words = serializers.ListField(child=serializers.CharField())

    unknown: set[str] = set()
    for data in ({"number": 1, "words": ["a"]}, {"number": "x"}):
        serializer = Probe(data=data)
        before = set(vars(serializer))
        serializer.is_valid()
        _ = serializer.errors, serializer.data
        if not serializer.errors:
            _ = serializer.validated_data
        unknown |= set(vars(serializer)) - before - set(_RESULTS) - _SHAPE
    return f"DRF now also caches {', '.join(sorted(unknown))}" if unknown else None


@contextmanager
def reused(serializer_class: type[S], data: Any) -> Iterator[S]:
    """This thread's ``serializer_class(data=data)``, for the duration of the block (a
    new one when the guard W026 found DRF caching more than it used to)."""
    if not seams.available("W026"):
        yield serializer_class(data=data)
        return
    free: dict[type, list[Any]] = _local.__dict__.setdefault("free", {})
    spare = free.setdefault(serializer_class, [])
    if spare:
        serializer = spare.pop()
        for name in _RESULTS:
            serializer.__dict__.pop(name, None)
        serializer.initial_data = data
    else:
        serializer = serializer_class(data=data)
    try:
        yield serializer
    finally:
        serializer.initial_data = None  # nothing of this request stays referenced
        for name in _RESULTS:
            serializer.__dict__.pop(name, None)
        spare.append(serializer)
