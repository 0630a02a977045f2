"""Settings of the load bench: the demo project's (PostgreSQL and Redis through
DATABASE_URL / REDIS_URL) plus the bench's adapter kind and a throttle that never
bites (the Redis round trip of the throttle is still paid)."""

from __future__ import annotations

from project.settings import *  # noqa: F403
from project.settings import LLM_ROUTING as _PROJECT_ROUTING

LLM_ROUTING = {
    **_PROJECT_ROUTING,
    "PROVIDER_KINDS": {"bench_openai": "bench.upstream_adapter.BenchOpenAIProvider"},
    "API_THROTTLE_RATES": {"user": "10000000/min", "anon": "10/min"},
}
