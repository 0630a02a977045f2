"""The demo project. Its Celery app is loaded with Django when Celery is installed, so
``shared_task`` binds to it (web process: eager or queueing; worker: consuming)."""

from __future__ import annotations

import importlib.util

__all__ = ["celery_app"]

if importlib.util.find_spec("celery") is not None:
    from .celery import app as celery_app
else:  # pragma: no cover - the demo installs celery; hosts may not
    celery_app = None
