"""The demo project's Celery app: configured from Django settings named ``CELERY_*``.

celery -A project worker -l info      # runs llm_routing.tasks
celery -A project beat -l info        # the retention schedule (CELERY_BEAT_SCHEDULE)
"""

from __future__ import annotations

import os

from celery import Celery

__all__ = ["app"]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
