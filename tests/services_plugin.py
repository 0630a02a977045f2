"""pytest plugin of the services suite: ``python3 dev.py test --services`` loads it
with ``-p tests.services_plugin``.

* Selects ``tests.settings_services`` (PostgreSQL + Redis) before pytest-django
  configures Django.
* Marks every test of the HTTP API modules (``tests/test_api*.py``,
  ``tests/test_openai_compat*.py``, ``tests/test_faces*.py``) ``services``, so
  ``-m services`` runs the whole API suite again on the real databases.
* Serves ``live_server`` with the project's ASGI application under uvicorn (the
  server of the shipped gunicorn.conf.py's workers; the embedded suite keeps
  pytest-django's WSGI live server), so the API suite runs again through the async
  views. In this process, not as a subprocess: the tests' environment (API keys),
  ``override_settings`` and registered provider kinds reach the server.
  ``tests/test_services_celery.py`` starts ``gunicorn -c gunicorn.conf.py`` itself,
  exactly as production does.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import pytest

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_services"

API_MODULE_PREFIXES = ("test_api", "test_openai_compat", "test_faces")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith(API_MODULE_PREFIXES):
            item.add_marker(pytest.mark.services)


class AsgiLiveServer:
    """pytest-django's ``live_server`` interface (``url``, the settings it modifies),
    served by uvicorn in a thread of the test process."""

    def __init__(self) -> None:
        import uvicorn
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
        from django.test.utils import modify_settings

        from project.asgi import application

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        # pytest-django's _live_server_helper enables these around each test.
        self._live_server_modified_settings = modify_settings(ALLOWED_HOSTS={"append": "127.0.0.1"})
        config = uvicorn.Config(
            ASGIStaticFilesHandler(application), log_level="warning", timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start the ASGI live server")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()

    def __str__(self) -> str:
        return self.url


def _asgi_live_server() -> Iterator[AsgiLiveServer]:
    server = AsgiLiveServer()
    try:
        yield server
    finally:
        server.stop()


def pytest_configure(config: pytest.Config) -> None:
    # Registered now, after pytest-django (entry points load after ``-p`` plugins): this
    # ``live_server`` is the one the tests get.
    holder = ModuleType("llmr_asgi_live_server")
    holder.live_server = pytest.fixture(scope="session", name="live_server")(_asgi_live_server)  # type: ignore[attr-defined]
    config.pluginmanager.register(holder, "llmr-asgi-live-server")
