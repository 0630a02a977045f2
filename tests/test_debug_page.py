"""Issue 11 (part A, item 15): the DEBUG technical 500 page of the demo project shows no
credential held in a URL (broker, cache, database) or a DSN."""

from __future__ import annotations

import sys

from django.test import RequestFactory, override_settings
from django.views.debug import technical_500_response

from project.reporting import mask_url_password


def _render(request) -> str:
    try:
        raise ValueError("boom")
    except ValueError:
        response = technical_500_response(request, *sys.exc_info())
    return response.content.decode()


@override_settings(
    DEBUG=True,
    CELERY_BROKER_URL="amqp://llmr:broker-pw-4711@127.0.0.1:5672//",
    CELERY_RESULT_BACKEND="redis://:result-pw-4712@127.0.0.1:6379/1",
    SENTRY_DSN="https://dsnkey4713@o1.ingest.example/42",
    DEMO_SERVICES={"cache": {"LOCATION": "redis://user:cache-pw-4714@10.0.0.5:6379/0"}},
)
def test_technical_500_masks_url_passwords_and_dsns():
    request = RequestFactory().get("/boom/")
    request.META["DATABASE_URL"] = "postgres://app:db-pw-4715@db.internal:5432/app"
    html = _render(request)
    for secret in ("broker-pw-4711", "result-pw-4712", "dsnkey4713", "cache-pw-4714", "db-pw-4715"):
        assert secret not in html
    # The rest of each URL stays readable for debugging.
    assert "amqp://llmr:********@127.0.0.1:5672//" in html
    assert "postgres://app:********@db.internal:5432/app" in html
    assert "CELERY_BROKER_URL" in html and "SENTRY_DSN" in html


def test_mask_url_password_leaves_urls_without_credentials_alone():
    assert mask_url_password("https://api.example.com/v1") == "https://api.example.com/v1"
    assert mask_url_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert mask_url_password("a redis://:pw@h/0 b amqp://u:p@h//") == (
        "a redis://:********@h/0 b amqp://u:********@h//"
    )
