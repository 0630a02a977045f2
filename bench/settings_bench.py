"""Settings of the load bench: the demo project's (PostgreSQL and Redis through
DATABASE_URL / REDIS_URL) plus a throttle rate that never bites (the throttle's Redis
round trip is still paid)."""

from __future__ import annotations

from project.settings import *  # noqa: F403
from project.settings import LLM_ROUTING as _PROJECT_ROUTING

LLM_ROUTING = {
    **_PROJECT_ROUTING,
    "API_THROTTLE_RATES": {"user": "10000000/min", "anon": "10/min"},
}
