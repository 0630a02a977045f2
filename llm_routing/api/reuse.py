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
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rest_framework.serializers import Serializer

__all__ = ["reused"]

S = TypeVar("S", bound=Serializer)

_local = threading.local()

#: What ``is_valid`` / ``validated_data`` / ``errors`` / ``data`` leave on an instance.
_RESULTS = ("_validated_data", "_errors", "_data")


@contextmanager
def reused(serializer_class: type[S], data: Any) -> Iterator[S]:
    """This thread's ``serializer_class(data=data)``, for the duration of the block."""
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
