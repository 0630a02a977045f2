"""The demo project's ASGI application: what ``gunicorn -c gunicorn.conf.py`` serves by
default (uvicorn workers). ``/audit/``, ``/v1/chat/completions`` and ``/health/`` are
served by their async faces here; the lifespan wrapper closes the adapters' async
HTTP clients when a worker stops (docs/production.md)."""

import os

from django.core.asgi import get_asgi_application

from llm_routing.asgi import with_lifespan

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = with_lifespan(get_asgi_application())
