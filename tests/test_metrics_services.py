"""/metrics under gunicorn with 2 workers in prometheus-client's multiprocess mode:
requests served by either worker add up in one scrape (whichever worker answers it)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
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


def _samples(base_url: str, name: str) -> float:
    response = httpx.get(
        base_url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name
    )


def _wait(what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_dead_workers_live_gauge_leaves_and_its_counts_stay(web: tuple[Stack, Path]) -> None:
    """gunicorn.conf.py's child_exit hook (prometheus-client's mark_process_dead): a
    worker killed with SIGKILL loses its live-gauge file (``llm_routing_build_info``
    counts live workers only), while what it counted stays in the sum."""
    stack, metrics_dir = web
    base_url = stack.base_url
    user = get_user_model().objects.create_user("metrics-kill", password="pw-metrics-123")
    token = Token.objects.create(user=user).key

    def one(_: int) -> int:
        return httpx.post(
            base_url + "/audit/",
            json={"task": "t", "input_text": "x"},
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        ).status_code

    def live_pids() -> set[int]:
        return {int(p.stem.rsplit("_", 1)[-1]) for p in metrics_dir.glob("gauge_livesum_*.db")}

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(one, range(REQUESTS))) == {200}
    counted = {int(p.stem.rsplit("_", 1)[-1]) for p in metrics_dir.glob("counter_*.db")}
    assert len(counted) >= 2, f"one worker served every request ({counted})"
    assert live_pids() == counted  # each worker's build_info, set when metrics loaded
    assert _samples(base_url, "llm_routing_build_info") == 2

    victim = min(counted)
    os.kill(victim, signal.SIGKILL)
    _wait("the master's child_exit hook", lambda: victim not in live_pids())
    assert (metrics_dir / f"counter_{victim}.db").exists()  # its counts are kept
    assert _samples(base_url, "llm_routing_requests_total") == REQUESTS

    # The master starts a replacement; the sum goes on across old and new workers.
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(one, range(REQUESTS))) == {200}
    assert _samples(base_url, "llm_routing_requests_total") == 2 * REQUESTS
    assert victim not in live_pids() and len(live_pids()) <= 2
    assert _samples(base_url, "llm_routing_build_info") == len(live_pids()) <= 2
