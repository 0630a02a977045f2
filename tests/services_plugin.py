"""pytest plugin of the services suite: ``python3 dev.py test --services`` loads it
with ``-p tests.services_plugin``.

* Selects ``tests.settings_services`` (PostgreSQL + Redis) before pytest-django
  configures Django.
* Marks every test of the HTTP API modules (``tests/test_api*.py``,
  ``tests/test_openai_compat*.py``) ``services``, so ``-m services`` runs the whole
  API suite again on the real databases.
"""

from __future__ import annotations

import os

import pytest

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_services"

API_MODULE_PREFIXES = ("test_api", "test_openai_compat")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith(API_MODULE_PREFIXES):
            item.add_marker(pytest.mark.services)
