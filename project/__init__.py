"""The demo project. Its Celery app is loaded with Django when Celery is installed, so
``shared_task`` binds to it (web process: eager or queueing; worker: consuming)."""

from __future__ import annotations

import importlib.util

__all__ = ["celery_app"]


def _celery_installed() -> bool:
    try:
        return importlib.util.find_spec("celery") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["celery"] is None
        return False


if _celery_installed():
    from .celery import app as celery_app
else:  # the demo installs celery; a host without it still runs (jobs run in-process)
    celery_app = None
