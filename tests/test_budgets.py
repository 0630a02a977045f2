"""Budgets (issue 15, item 5; docs/budgets.md) on the embedded cache (LocMem): caps per
token, user, group and everyone, the 429 bodies of ``/audit/`` and ``/v1``, windows
rolling over, tokens settled after the answer, the soft-threshold signal, the cache-down
policy and the model's validation."""

from __future__ import annotations

import contextvars
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing import budgets
from llm_routing.api import throttles
from llm_routing.cache import CacheBackoff
from llm_routing.models import Budget
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CircuitStore

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

MSG = {"model": "main", "messages": [{"role": "user", "content": "Say hello."}]}
AUDIT = {"task": "summarize", "input_text": "Django is a web framework."}
# 2026-03-31 23:59:30 UTC: a minute, an hour, a day and a month all end 30 s later.
T0 = datetime(2026, 3, 31, 23, 59, 30, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _budget_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    clock = Clock(T0)
    monkeypatch.setattr(budgets, "clock", clock)
    budgets.reset_cache_state()
    yield clock
    budgets.reset_cache_state()


@pytest.fixture
def clock(_budget_state: Clock) -> Clock:
    return _budget_state


@pytest.fixture
def chain(scripted, key_env):
    return make_chain("main", [make_provider("a")], is_default=True)


def token_of(client: APIClient) -> str:
    return str(client._credentials["HTTP_AUTHORIZATION"].split()[1])


def audit(client: APIClient) -> Any:
    return client.post("/audit/", data=json.dumps(AUDIT), content_type="application/json")


def chat(client: APIClient) -> Any:
    return client.post(
        "/v1/chat/completions", data=json.dumps(MSG), content_type="application/json"
    )


def test_a_token_cap_of_3_serves_3_and_refuses_the_4th_on_audit(api, chain):
    Budget.objects.create(name="tok-3", scope="token", subject=token_of(api), max_requests=3)
    assert [audit(api).status_code for _ in range(3)] == [200, 200, 200]
    refused = audit(api)
    assert refused.status_code == 429
    body = refused.json()
    assert set(body) == {"budget", "window", "reset_at", "detail"}
    assert body["budget"] == "tok-3" and body["window"] == "day"
    assert body["reset_at"] == "2026-04-01T00:00:00Z"
    assert refused["Retry-After"] == "30"
    assert "tok-3" in body["detail"]
    assert token_of(api) not in refused.content.decode()  # the token key is a secret


def test_v1_refusal_is_in_openai_error_envelope(api, chain):
    Budget.objects.create(name="alice-daily", scope="user", subject="alice", max_requests=3)
    assert [chat(api).status_code for _ in range(3)] == [200, 200, 200]
    refused = chat(api)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert error["type"] == "rate_limit_error"
    assert error["budget"] == "alice-daily"
    assert error["window"] == "day"
    assert error["reset_at"] == "2026-04-01T00:00:00Z"
    assert "alice-daily" in error["message"]
    assert refused["Retry-After"] == "30"


def test_group_and_global_budgets_apply_and_others_are_untouched(api, chain, django_user_model):
    staff = Group.objects.create(name="staff")
    alice = django_user_model.objects.get(username="alice")
    alice.groups.add(staff)
    Budget.objects.create(name="staff-g", scope="group", subject="staff", max_requests=2)
    Budget.objects.create(name="everyone", scope="global", max_requests=5)
    Budget.objects.create(name="bob-only", scope="user", subject="bob", max_requests=1)
    assert [audit(api).status_code for _ in range(3)] == [200, 200, 429]
    assert audit(api).json()["budget"] == "staff-g"
    # bob is not in staff: only the global budget counts him (2 of 5 used by alice).
    bob = django_user_model.objects.create_user(username="carol", password="pw-carol-123")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    assert [audit(other).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert audit(other).json()["budget"] == "everyone"


def test_a_refusal_counts_nothing_in_the_other_budgets(api, chain):
    Budget.objects.create(name="a-small", scope="user", subject="alice", max_requests=1)
    big = Budget.objects.create(name="b-big", scope="global", max_requests=100)
    assert [audit(api).status_code for _ in range(4)] == [200, 429, 429, 429]
    assert budgets.usage([big])["b-big"].requests == 1  # all or nothing


def test_windows_roll_over(api, chain, clock):
    Budget.objects.create(
        name="per-minute", scope="user", subject="alice", window="minute", max_requests=2
    )
    assert [audit(api).status_code for _ in range(3)] == [200, 200, 429]
    clock.now = T0 + 29  # still 23:59:59
    assert audit(api).status_code == 429
    clock.now = T0 + 30  # 00:00:00: a new minute
    assert [audit(api).status_code for _ in range(3)] == [200, 200, 429]
    assert audit(api).json()["reset_at"] == "2026-04-01T00:01:00Z"


def test_month_window_resets_at_the_first_of_the_next_month():
    start, end = budgets.window_bounds("month", datetime(2026, 12, 15, tzinfo=UTC).timestamp())
    assert (start.isoformat(), end.isoformat()) == (
        "2026-12-01T00:00:00+00:00",
        "2027-01-01T00:00:00+00:00",
    )


def test_token_cap_is_settled_after_the_answer(api, chain):
    budget = Budget.objects.create(name="tokens", scope="user", subject="alice", max_tokens=10)
    # Each answer uses 3 + 4 tokens: 0 < 10 and 7 < 10 are served, 14 >= 10 is not.
    assert [chat(api).status_code for _ in range(3)] == [200, 200, 429]
    use = budgets.usage([budget])["tokens"]
    assert (use.requests, use.tokens) == (2, 14)


def test_soft_threshold_signal_fires_once_per_window(api, chain, clock):
    Budget.objects.create(
        name="soft", scope="user", subject="alice", max_requests=5, soft_threshold=0.4
    )
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append({k: v for k, v in kwargs.items() if k != "signal"})

    budgets.budget_threshold_reached.connect(receiver)
    try:
        for _ in range(5):
            assert audit(api).status_code == 200
        assert seen == [
            {
                "name": "soft",
                "scope": "user",
                "subject": "alice",
                "window": "day",
                "used": 2,
                "cap": 5,
                "metric": "requests",
            }
        ]
        clock.now = T0 + 60  # the next day: fires again once
        for _ in range(3):
            audit(api)
        assert len(seen) == 2
    finally:
        budgets.budget_threshold_reached.disconnect(receiver)


def test_no_budget_no_cost(api, chain):
    assert [audit(api).status_code for _ in range(5)] == [200] * 5


def test_disabled_budget_is_ignored(api, chain):
    Budget.objects.create(name="off", scope="global", max_requests=1, enabled=False)
    assert [audit(api).status_code for _ in range(3)] == [200] * 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket closes


def _dead_redis() -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{_closed_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }


def test_cache_down_fails_open_by_default_and_closed_on_request(api, chain, caplog, monkeypatch):
    # The dead cache also trips the throttles' and circuits' own fail-open state: keep
    # it in this test (monkeypatch restores it).
    monkeypatch.setattr(throttles, "backoff", CacheBackoff(log_interval_s=60.0))
    monkeypatch.setattr(breaker, "store", CircuitStore())
    Budget.objects.create(name="open-b", scope="user", subject="alice", max_requests=1)
    with override_settings(CACHES=_dead_redis()):
        assert [audit(api).status_code for _ in range(3)] == [200, 200, 200]
        assert "Budget cache unavailable (ConnectionError)" in caplog.text
        Budget.objects.create(
            name="closed-b", scope="global", max_requests=100, on_cache_down="closed"
        )
        refused = audit(api)
        assert refused.status_code == 503
        assert refused.json()["budget"] == "closed-b" and refused.json()["reset_at"] is None
        assert refused["Retry-After"] == "5"
        v1 = chat(api)
        assert v1.status_code == 503
        assert v1.json()["error"]["code"] == "budget_unavailable"


def test_model_needs_a_cap_and_a_subject_by_scope():
    with pytest.raises(ValidationError) as exc:
        Budget(name="none", scope="global").full_clean()
    assert "max_requests" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        Budget(name="nosub", scope="user", max_requests=1).full_clean()
    assert "subject" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        Budget(name="sub", scope="global", subject="x", max_requests=1).full_clean()
    assert "subject" in exc.value.message_dict
    Budget(name="ok", scope="global", max_cost_usd=Decimal("1.5")).full_clean()
    with transaction.atomic(), pytest.raises(IntegrityError):
        Budget.objects.create(name="db-none", scope="global")


def test_python_api_check_without_a_principal_counts_global_budgets():
    Budget.objects.create(name="g", scope="global", max_requests=1)
    assert budgets.check(None) is None
    refusal = budgets.check(None)
    assert refusal is not None and refusal.budget == "g" and refusal.status == 429
    budgets.forget()


def test_admin_pages_show_use_against_cap(api, chain, admin_client):
    tok = Budget.objects.create(
        name="tok-cap", scope="token", subject=token_of(api), max_requests=3, max_tokens=100
    )
    Budget.objects.create(name="idle", scope="global", window="month", max_cost_usd="2.5")
    audit(api)
    audit(api)
    listing = admin_client.get("/admin/llm_routing/budget/")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert "2 / 3" in page  # requests used against the cap
    assert "14 / 100" in page  # tokens settled after the two answers
    assert "0 / 2.500000" in page  # cost: none recorded yet
    assert token_of(api) not in page  # the token key is masked in the list
    assert "2026-04-01 00:00" in page  # when the day resets
    filtered = admin_client.get("/admin/llm_routing/budget/?scope__exact=global")
    assert "idle" in filtered.content.decode() and "tok-cap" not in filtered.content.decode()
    change = admin_client.get(f"/admin/llm_routing/budget/{tok.pk}/change/").content.decode()
    assert "requests 2 / 3 · tokens 14 / 100" in change
    assert admin_client.get("/admin/llm_routing/budget/add/").status_code == 200


def test_budget_rows_are_cached_per_process_and_a_save_applies_at_once(
    api, chain, monkeypatch, django_assert_num_queries
):
    monkeypatch.setattr(budgets, "ROWS_TTL_S", 3600.0)
    budget = Budget.objects.create(name="cached", scope="global", max_requests=1)
    assert audit(api).status_code == 200
    assert audit(api).status_code == 429
    Budget.objects.filter(pk=budget.pk).update(max_requests=5)  # no signal: still cached
    assert audit(api).status_code == 429
    budget.refresh_from_db()
    budget.save()  # a save (the admin, the config file) clears this process's copy
    assert audit(api).status_code == 200
    with django_assert_num_queries(0):
        assert budgets.applicable(None) == [budget]  # cached rows: no query


def test_streamed_requests_are_counted_too(api, chain):
    Budget.objects.create(name="streams", scope="user", subject="alice", max_requests=1)
    body = {**AUDIT, "stream": True}
    first = api.post("/audit/", data=json.dumps(body), content_type="application/json")
    assert first.status_code == 200
    b"".join(first.streaming_content)
    second = api.post("/audit/", data=json.dumps(body), content_type="application/json")
    assert second.status_code == 429 and second.json()["budget"] == "streams"


def test_dashboard_shows_requests_per_provider_and_per_user(
    api, chain, admin_client, django_user_model
):
    bob = django_user_model.objects.create_user(username="bob", password="pw-bob-123")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    for _ in range(3):
        assert audit(api).status_code == 200
    assert audit(other).status_code == 200
    assert chat(other).status_code == 200
    url = "/admin/llm_routing/routingdecision/dashboard/"
    html = admin_client.get(url, {"window": "1h"}).content.decode()
    providers = html.split('id="llmr-spend-providers"')[1].split("</table>")[0]
    assert '<td>a</td><td class="llmr-num">5</td>' in providers
    users = html.split('id="llmr-spend-users"')[1].split("</table>")[0]
    assert users.index('<td>alice</td><td class="llmr-num">3</td>') < users.index(
        '<td>bob</td><td class="llmr-num">2</td>'
    )


def test_cost_cap_is_settled_exactly_and_overshot_by_at_most_one_request():
    budget = Budget.objects.create(name="cost", scope="global", max_cost_usd=Decimal("0.000006"))
    served = 0
    while budgets.check(None) is None:
        served += 1
        budgets.settle(0, Decimal("0.0000025"))  # what the answer cost
        budgets.forget()
    # 0, 2.5 and 5 µ$ are under the 6 µ$ cap: three served; 7.5 µ$ overshoots by less
    # than one request's cost.
    assert served == 3
    assert budgets.usage([budget])["cost"].cost_usd == Decimal("0.0000075")
    budgets.forget()


def test_a_sub_nano_dollar_cost_is_rounded_up_never_lost():
    budget = Budget.objects.create(name="tiny", scope="global", max_requests=100)
    assert budgets.check(None) is None
    budgets.settle(0, 1e-12)
    assert budgets.usage([budget])["tiny"].cost_usd == Decimal("0.000000001")
    budgets.forget()


@pytest.mark.django_db(transaction=True)  # the hook reads the rows in a worker thread
def test_async_hook_carries_the_grant_back_into_the_async_caller():
    from types import SimpleNamespace

    from asgiref.sync import async_to_sync

    from llm_routing.api.budget_guard import BudgetRefused, aenforce_budgets
    from llm_routing.types import Principal

    budget = Budget.objects.create(name="async-g", scope="global", max_requests=1)
    request = SimpleNamespace(auth=None)  # what the hook reads of DRF's request

    async def view() -> str:
        await aenforce_budgets(request, Principal())
        budgets.settle(7)  # the router's answer, in the view's own context
        try:
            await aenforce_budgets(request, Principal())
        except BudgetRefused as exc:
            return str(exc.openai_body()["error"]["code"])
        return "served"

    assert async_to_sync(view)() == "budget_exceeded"
    assert budgets.usage([budget])["async-g"].tokens == 7
    budgets.forget()


def request() -> tuple[budgets.Refusal | None, budgets.Grant | None]:
    """``budgets.check`` as one more request in flight (its own context), and its grant."""
    return contextvars.Context().run(lambda: (budgets.check(None), budgets._current.get()))


def answer(grant: budgets.Grant | None, tokens: int, cost: str) -> None:
    """That request's answer: settle its usage in its own context."""

    def run() -> None:
        budgets._current.set(grant)
        budgets.settle(tokens, Decimal(cost))

    contextvars.Context().run(run)


def test_requests_in_flight_hold_the_room_of_a_cost_cap():
    """Before any request has settled, one at a time; then the requests in flight are
    each counted at the largest settled cost (the peak), so the cap is overshot by at
    most one request's cost."""
    budget = Budget.objects.create(name="room", scope="global", max_cost_usd=Decimal("0.00001"))
    refused, first = request()
    assert refused is None  # the first: the peak is unknown
    held, _ = request()
    assert held is not None and held.code == "budget_in_flight" and held.status == 429
    assert held.reset_at is None and held.retry_after == budgets.IN_FLIGHT_RETRY_S
    assert held.body()["budget"] == "room"
    assert budgets.usage([budget])["room"].requests == 1  # the held one is not counted
    answer(first, 5, "0.000003")  # peak 3 µ$, 3 of 10 µ$ spent
    # A request is let in while spent + in flight x peak stays under the cap:
    # 3 + 0 x 3, 3 + 1 x 3, 3 + 2 x 3 = 9 < 10 are; 3 + 3 x 3 = 12 is not.
    grants = []
    for _ in range(3):
        refused, grant = request()
        assert refused is None
        grants.append(grant)
    assert request()[0].code == "budget_in_flight"
    for grant in grants:
        answer(grant, 5, "0.000003")
    refused, _ = request()
    assert refused.code == "budget_exceeded" and refused.reset_at is not None
    spent = budgets.usage([budget])["room"].cost_usd
    assert spent == Decimal("0.000012")  # over the cap by less than one request's cost


def test_a_request_that_never_settles_gives_its_place_back():
    Budget.objects.create(name="tok", scope="global", max_tokens=100)
    assert budgets.check(None) is None  # this request
    assert request()[0].code == "budget_in_flight"  # another: the peak is unknown
    budgets.forget()  # e.g. an async job's submission: no usage in this request
    assert request()[0] is None


def test_a_dead_workers_place_ends_with_its_lease(clock):
    Budget.objects.create(name="tok", scope="global", max_tokens=100)
    assert request()[0] is None  # neither settled nor forgotten: its worker died
    assert request()[0].code == "budget_in_flight"
    clock.now += budgets._lease_s() + 1
    assert request()[0] is None


def test_an_answer_without_usage_leaves_the_peak_unknown():
    """A request that failed before any answer used no tokens: it says nothing about
    what a request costs, so the budget still lets one request at a time in."""
    Budget.objects.create(name="usd", scope="global", max_cost_usd=Decimal("1"))
    refused, grant = request()
    answer(grant, 0, "0")
    refused, grant = request()
    assert refused is None
    assert request()[0].code == "budget_in_flight"
    answer(grant, 10, "0")  # an unpriced model: tokens used, cost 0: peak 0
    assert [request()[0] for _ in range(3)] == [None] * 3  # a free request holds no room


def test_the_answer_settles_its_cost_from_the_price_override(
    api, fake_upstream, upstream_chain, monkeypatch
):
    """Through /audit/: the request_routed receiver adds the routed request's cost (the
    row's price override times the tokens the fake upstream reported) to the budget."""
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-budget-cost-0123456789")
    upstream_chain(
        ("oa", "openai", {"input_price_per_mtok": Decimal(1000),
                          "output_price_per_mtok": Decimal(2000)}),
    )  # fmt: skip
    budget = Budget.objects.create(name="usd", scope="global", max_cost_usd=Decimal("0.06"))
    assert [audit(api).status_code for _ in range(3)] == [200, 200, 200]
    # 11 prompt + 7 completion tokens an answer: 0.011 + 0.014 = $0.025 each.
    use = budgets.usage([budget])["usd"]
    assert use.cost_usd == Decimal("0.075") and use.tokens == 54
    refused = audit(api)
    assert refused.status_code == 429 and refused.json()["budget"] == "usd"


def test_forget_on_the_event_loop_releases_in_a_worker_thread(monkeypatch):
    """request_finished runs inline on the event loop under ASGI: the release of a place
    in flight (a cache round trip on Redis) goes to a worker thread."""
    import asyncio
    import threading

    Budget.objects.create(name="tok", scope="global", max_tokens=100)
    threads = []
    real = budgets._release_quietly

    def release(grant):
        threads.append(threading.current_thread())
        real(grant)

    monkeypatch.setattr(budgets, "_release_quietly", release)

    async def request_on_the_loop() -> threading.Thread:
        budgets.forget()  # the grant of the check below, as request_finished ends it
        return threading.current_thread()

    assert budgets.check(None) is None  # (the row lookup needs a thread: done here)
    loop_thread = asyncio.run(request_on_the_loop())  # waits for the executor's work
    assert len(threads) == 1 and threads[0] is not loop_thread
    assert request()[0] is None  # the place was given back


def test_rows_expiring_during_acheck_are_not_read_on_the_event_loop(monkeypatch):
    """acheck found the rows fresh and counted on the loop; had it read them a second
    time, an expiry in between (or a saved row) would run the ORM on the event loop:
    SynchronousOnlyOperation, a 500. The rows are read once."""
    import asyncio
    import time as real_time
    from types import SimpleNamespace

    Budget.objects.create(name="tok", scope="global", max_tokens=10**6)
    assert budgets.check(None) is None  # the rows, read in this thread: fresh now
    budgets.forget()
    reads: list[float] = []

    def monotonic() -> float:  # fresh for the first read, expired for any later one
        reads.append(real_time.monotonic())
        return reads[-1] + (0 if len(reads) == 1 else budgets.ROWS_TTL_S + 1)

    monkeypatch.setattr(budgets, "time", SimpleNamespace(monotonic=monotonic))
    assert asyncio.run(budgets.acheck(None)) is None  # counted, no query on the loop
    assert len(reads) >= 2  # the clock did move past the rows' expiry meanwhile


def test_on_the_event_loop_the_answer_is_settled_by_a_task():
    """The async router sends request_routed on the event loop: the receiver returns at
    once and a task settles (LocMem: in a worker thread), releasing the place."""
    import asyncio

    from llm_routing.router import route
    from llm_routing.signals import asend, request_routed
    from llm_routing.types import AuditRequest

    request_ = AuditRequest(task="t", input_text="x", provider="mock")
    routed = route(request_, persist=False)
    tokens = routed.result.usage.input_tokens + routed.result.usage.output_tokens
    budget = Budget.objects.create(name="tok", scope="global", max_tokens=10**6)
    assert budgets.check(None) is None
    assert request()[0].code == "budget_in_flight"

    async def finish() -> int:  # as the async router's exit announces it
        await asend(request_routed, request_id=routed.request_id, request=request_,
                    routed=routed)  # fmt: skip
        return len(budgets._settling)

    assert asyncio.run(finish()) == 0  # the task is done: the announcement awaited it
    assert budgets.usage([budget])["tok"].tokens == tokens > 0
    assert request()[0] is None  # the place was given back, the peak is known


def test_sent_synchronously_on_a_loop_the_settlement_outlives_the_loop():
    """``request_routed`` sent with the synchronous ``send`` on an event loop (the async
    router's exit when a cancellation or a failed announcement tore it down) has no
    announcement to await a settlement task: ``asyncio.run`` cancelled that task as the
    loop ended, so the tokens were never charged and the place in flight was held until
    its lease (the ledger property of tests/test_issue22_ledger.py found it). A worker
    thread of the loop's executor settles instead; ``asyncio.run`` waits for it.

    The loop's executor here starts nothing before it is shut down (a busy pool), so the
    task's call, waiting for a thread, is certainly cancelled with the loop."""
    import asyncio
    import concurrent.futures

    class BusyPool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self) -> None:
            super().__init__(max_workers=1)
            self.queued: list[tuple[concurrent.futures.Future[Any], Any]] = []

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self.queued.append((future, lambda: fn(*args, **kwargs)))
            return future

        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            queued, self.queued = self.queued, []
            for future, call in queued:  # what was not cancelled runs now
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(call())
                    except Exception as exc:
                        future.set_exception(exc)
            super().shutdown(wait=wait, cancel_futures=cancel_futures)

    from llm_routing.router import route
    from llm_routing.signals import request_routed, send
    from llm_routing.types import AuditRequest

    request_ = AuditRequest(task="t", input_text="x", provider="mock")
    routed = route(request_, persist=False)
    tokens = routed.result.usage.input_tokens + routed.result.usage.output_tokens
    budget = Budget.objects.create(name="tok", scope="global", max_tokens=10**6)

    assert budgets.check(None) is None  # this request's place in flight
    assert request()[0].code == "budget_in_flight"

    async def torn_down() -> None:
        asyncio.get_running_loop().set_default_executor(BusyPool())
        send(request_routed, request_id=routed.request_id, request=request_, routed=routed)
        raise asyncio.CancelledError  # the request's task was cancelled: the loop ends

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(torn_down())
    assert budgets.usage([budget])["tok"].tokens == tokens > 0
    assert request()[0] is None  # the place was given back


def test_an_exhausted_budget_is_named_before_one_held_by_requests_in_flight():
    Budget.objects.create(name="a-held", scope="global", max_tokens=100)
    Budget.objects.create(name="b-done", scope="global", max_requests=2)
    assert request()[0] is None  # in flight in a-held (peak unknown); b-done: 1 of 2
    refused, _ = request()
    assert refused.budget == "a-held" and refused.code == "budget_in_flight"
    Budget.objects.filter(name="b-done").update(max_requests=1)
    budgets.reset_cache_state()  # the rows again
    refused, _ = request()
    assert refused.budget == "b-done" and refused.code == "budget_exceeded"


def test_a_grant_carries_the_room_admission_saw():
    """What a request's tokens and cost caps had left for it when it was admitted (read
    by hedging, docs/strategies.md): per metric, the smallest ``cap - used - other
    requests in flight x peak`` over its budgets; a request cap has no room."""
    Budget.objects.create(name="room-t", scope="global", max_tokens=1000)
    Budget.objects.create(name="room-t2", scope="global", max_tokens=5000)
    Budget.objects.create(name="room-c", scope="global", max_cost_usd=Decimal("0.00001"))
    Budget.objects.create(name="room-r", scope="global", max_requests=100)
    refused, first = request()
    assert refused is None and first.room == budgets.Room(tokens=1000, nano_usd=10_000)
    answer(first, 100, "0.000002")  # peaks: 100 tokens, 2 µ$ (2000 nano-USD)
    _, second = request()  # nobody else in flight
    assert second.room == budgets.Room(tokens=900, nano_usd=8000)
    _, third = request()  # the second is in flight, held at the peaks
    assert third.room == budgets.Room(tokens=800, nano_usd=6000)
    assert third.room.holds(800, 6000) and not third.room.holds(801, 0)
    assert not third.room.holds(0, 6001)


def test_room_is_none_without_a_tokens_or_cost_cap():
    Budget.objects.create(name="reqs", scope="global", max_requests=5)
    checked = contextvars.Context().run(lambda: (budgets.check(None), budgets.room()))
    assert checked == (None, None)
    assert budgets.room() is None  # no request admitted in this context
    assert budgets.Room().holds(10**9, 10**9)  # nothing capped: anything fits
