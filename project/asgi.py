"""The demo project's ASGI application: what ``gunicorn -c gunicorn.conf.py`` serves by
default (uvicorn workers). ``/audit/``, ``/v1/chat/completions`` and ``/health/`` are
served by their async faces here; the lifespan wrapper closes the adapters' async
HTTP clients when a worker stops (docs/production.md)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# Django's handler, with its stock middleware's hooks run on the event loop (no thread
# hop per hook) and the lifespan protocol answered (llm_routing/asgi.py).
from llm_routing.asgi import get_asgi_application

application = get_asgi_application()
