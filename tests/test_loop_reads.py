"""On the event loop, what was checked "answers from memory" stays the answer.

An ASGI request to an API view first asks whether its admission can run on the loop
(the config snapshot fresh, the token's user cached and fresh), then runs that
admission there. An entry that expires between the question and its use must not turn
into a database read on the loop: Django raises ``SynchronousOnlyOperation`` there and
the caller gets a 500 (the fuzz step saw one in CI, once in some 2,500 ASGI requests).
Each test moves a clock on at every read, so the entry is fresh at the question and
expired at the use; both fail without their fix.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from rest_framework.authtoken.models import Token

from llm_routing import snapshot
from llm_routing.api import authentication
from llm_routing.models import RoutingDecision
from tests.conftest import make_chain, make_provider

BODY = json.dumps({"model": "main", "messages": [{"role": "user", "content": "hi"}]})


class Ticking:
    """A clock that moves ``step`` seconds on at every read."""

    def __init__(self, step: float) -> None:
        self.now = 1_000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture(autouse=True)
def _strict(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test module may have allowed sync calls on the loop for its process.
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


@pytest.fixture
def token(user: Any) -> str:
    make_chain("main", [make_provider("canned", kind="mock")], is_default=True)
    return Token.objects.create(user=user).key


def post_on_the_loop(token: str) -> Any:
    async def go() -> Any:
        return await AsyncClient(raise_request_exception=False).post(
            "/v1/chat/completions",
            BODY,
            content_type="application/json",
            headers={"authorization": f"Token {token}"},
        )

    return async_to_sync(go)()


def warm(token: str) -> None:
    """Snapshot and token cache built by a plain WSGI request."""
    response = Client().post(
        "/v1/chat/completions", BODY, "application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert response.status_code == 200, response.content


@pytest.mark.django_db(transaction=True)
def test_a_token_entry_expiring_after_the_check_is_still_the_answer(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read 3 s on (the TTL is 5 s): the warm-up caches the token until t+5; the
    # check reads t+3 (fresh, so admission runs on the loop); a second read would see
    # t+6, expired, and look the token up in the database on the loop.
    clock = Ticking(step=authentication.TOKEN_CACHE_TTL_S * 0.6)
    monkeypatch.setattr(authentication, "_clock", clock)
    warm(token)
    response = post_on_the_loop(token)
    assert response.status_code == 200, response.content
    request_id = response.json()["id"].removeprefix("chatcmpl-")
    assert RoutingDecision.objects.filter(request_id=request_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_expiring_after_acurrent_is_what_the_loop_reads(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each read past MAX_AGE_S: acurrent() rebuilds in a worker thread, and every later
    # read finds the snapshot expired, admission's on the loop included.
    warm(token)
    monkeypatch.setattr(snapshot._holder, "clock", Ticking(step=snapshot.MAX_AGE_S + 1))
    response = post_on_the_loop(token)
    assert response.status_code == 200, response.content
    built = snapshot.latest()
    assert built is not None and built.chain("main") is not None


def _current_on_a_loop() -> snapshot.ConfigSnapshot:
    async def read() -> snapshot.ConfigSnapshot:
        return snapshot.current()

    return asyncio.run(read())


@pytest.mark.django_db(transaction=True)  # the loop's rebuild reads committed rows
def test_on_a_loop_current_answers_from_memory_unless_the_process_allows_queries_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_chain("first", [make_provider("one", kind="mock")])
    assert snapshot.current().chain("first") is not None
    make_chain("second", [make_provider("two", kind="mock")])  # a change in this process
    # Django would refuse the rebuild's queries on the loop: the last snapshot answers.
    assert _current_on_a_loop().chain("second") is None
    # A notebook's (or a Playwright test's) thread runs a loop and allows them: the
    # change is seen there as anywhere else.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert _current_on_a_loop().chain("second") is not None
