"""/metrics under gunicorn with 2 workers in prometheus-client's multiprocess mode:
requests served by either worker add up in one scrape (whichever worker answers it)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from tests.test_services_celery import Stack, require_postgres  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

METRICS_TOKEN = "services-metrics-token-5c1d"
REQUESTS = 40


@pytest.fixture
def web(tmp_path: Path, require_postgres: None) -> Iterator[tuple[Stack, Path]]:  # noqa: F811
    stack = Stack("redis", tmp_path)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    stack.env.update(
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        LLM_ROUTING_METRICS_TOKEN=METRICS_TOKEN,
    )
    try:
        stack.web(workers=2)
        yield stack, metrics_dir
    finally:
        stack.close()


def _requests_total(base_url: str) -> float:
    response = httpx.get(
        base_url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    total = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "llm_routing_requests_total":
                total += sample.value
    return total


def test_counts_add_up_across_two_workers(web: tuple[Stack, Path]) -> None:
    stack, metrics_dir = web
    base_url = stack.base_url
    user = get_user_model().objects.create_user("metrics", password="pw-metrics-123")
    token = Token.objects.create(user=user).key
    assert _requests_total(base_url) == 0

    def one(_: int) -> int:
        response = httpx.post(
            base_url + "/audit/",
            json={"task": "t", "input_text": "x"},
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        )
        return response.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(one, range(REQUESTS))) == {200}
    pids = {p.stem.rsplit("_", 1)[-1] for p in metrics_dir.glob("counter_*.db")}
    assert len(pids) >= 2, f"one worker served every request ({pids}); cannot show the sum"
    assert _requests_total(base_url) == REQUESTS
    assert httpx.get(base_url + "/metrics", timeout=10).status_code == 401
