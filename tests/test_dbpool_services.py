"""The demo project on PostgreSQL with Django's connection pool (psycopg_pool): sized
from DB_POOL_MIN / DB_POOL_MAX, and no pooled connection is held while a request waits
on its upstream (services suite)."""

from __future__ import annotations

import json
import os

import pytest
from django.conf import settings
from django.db import connection

from .support import clean_env, python

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "postgresql" not in settings.DATABASES["default"]["ENGINE"], reason="services suite"
    ),
]

SCRIPT = """
import json
import django
django.setup()
from django.conf import settings
from django.db import connection
from llm_routing.models import Chain, ChainEntry, Provider
from llm_routing.router import route
from llm_routing.signals import before_provider_call
from llm_routing.types import AuditRequest

held = []
before_provider_call.connect(
    lambda **kw: held.append(connection.connection is not None), weak=False
)
chain = Chain.objects.create(name="pooled", is_default=True)
ChainEntry.objects.create(
    chain=chain, provider=Provider.objects.create(name="m", kind="mock"), position=0
)
routed = route(AuditRequest(task="t", input_text="x"))
stats = connection.pool.get_stats()
print(json.dumps({
    "pool": settings.DATABASES["default"]["OPTIONS"]["pool"],
    "max_age": settings.DATABASES["default"]["CONN_MAX_AGE"],
    "served": routed.result.provider,
    "held_during_call": held,
    "pool_max": stats["pool_max"],
}))
"""


def test_pool_from_env_and_no_connection_held_across_the_upstream_call() -> None:
    db = connection.settings_dict
    env = clean_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        DEBUG="true",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        CONN_MAX_AGE="60",
        DB_POOL_MIN="1",
        DB_POOL_MAX="3",
        PYTHONPATH=os.getcwd(),
    )
    result = python("-c", SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["pool"] == {"min_size": 1, "max_size": 3, "timeout": 10.0}
    assert shown["max_age"] == 0  # Django's requirement with a pool
    assert shown["pool_max"] == 3
    assert shown["served"] == "m"
    # The rows were written and read before the call; the connection was handed back.
    assert shown["held_during_call"] == [False]
