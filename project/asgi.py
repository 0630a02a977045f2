"""The demo project's ASGI application: what ``gunicorn -c gunicorn.conf.py`` serves by
default (uvicorn workers). ``/v1/*`` (the OpenAI-style faces) is served on the lean
lane, without Django's request cycle (``llm_routing.asgi.lane``); ``/audit/``,
``/health/``, the admin and everything else by Django's handler, with the lifespan
protocol answered so the adapters' async HTTP clients close when a worker stops
(docs/production.md)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# Django's handler, with its stock middleware's hooks run on the event loop (no thread
# hop per hook) and the lifespan protocol answered (llm_routing/asgi.py), inside the
# lane that serves /v1/* itself (llm_routing/lane.py).
from llm_routing.asgi import get_asgi_application, lane

#: The same project without the lane: /v1/* through Django's request cycle too
#: (bench/gateways.py measures both: GUNICORN_APP=project.asgi:django_application).
django_application = get_asgi_application()
application = lane(django_application)
