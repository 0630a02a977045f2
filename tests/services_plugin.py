"""pytest plugin of the services suite: ``python3 dev.py test --services`` loads it
with ``-p tests.services_plugin``.

* Selects ``tests.settings_services`` (PostgreSQL + Redis) before pytest-django
  configures Django.
* Marks every ``tests/test_api*.py`` test ``services``, so ``-m services`` runs the
  whole API suite again on the real databases.
"""

from __future__ import annotations

import os

import pytest

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_services"

API_MODULE_PREFIX = "test_api"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith(API_MODULE_PREFIX):
            item.add_marker(pytest.mark.services)
