"""The config snapshot (llm_routing.snapshot): a routed request reads no configuration
row, every change is seen — at once in the process that made it, within the check
interval everywhere else, on a short TTL while the cache is down."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.cache import caches
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from llm_routing import snapshot
from llm_routing.access import refusal
from llm_routing.config_io import apply
from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule
from llm_routing.router import explain, route
from llm_routing.types import AuditRequest, Principal

from .breaker_support import FakeClock
from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

REQUEST = AuditRequest(task="summarize", input_text="some input")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The snapshot's monotonic clock, moved by hand."""
    fake = FakeClock(1000.0)
    monkeypatch.setattr(snapshot._holder, "clock", fake)
    return fake


@pytest.fixture
def main_chain(scripted: Any, key_env: str) -> Chain:
    a, b = make_provider("a"), make_provider("b")
    return make_chain("main", [a, b], is_default=True)


def served_by(request: AuditRequest = REQUEST) -> str:
    return route(request, persist=False).result.provider


def reads(queries: CaptureQueriesContext) -> list[str]:
    """Every statement except the writes of the request's own records."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if not q["sql"].lstrip().upper().startswith(("INSERT", "SAVEPOINT", "RELEASE"))
    ]


def edit_behind_the_apps_back(sql: str, *params: Any) -> None:
    """A change no signal announces (as another process's change looks to this one)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def bump_shared_version() -> None:
    """What another process's commit does to the shared version key."""
    caches["default"].set(snapshot.VERSION_KEY, "another-process", None)


# --- no configuration reads on the request path ------------------------------------------


def test_no_configuration_query_per_route_after_warm_up(main_chain: Chain) -> None:
    RoutingRule.objects.create(name="r", task_glob="translate*", chain=main_chain)
    route(REQUEST)  # warm-up: builds the snapshot
    with CaptureQueriesContext(connection) as queries:
        routed = route(REQUEST)
        explain(REQUEST)
        translated = route(AuditRequest(task="translate", input_text="x"))
        named = route(AuditRequest(task="t", input_text="x", chain="main", provider="b"))
    assert routed.result.provider == "a" and translated.metadata.rule == "r"
    assert named.result.provider == "b"
    assert reads(queries) == []
    assert any(q["sql"].lstrip().upper().startswith("INSERT") for q in queries.captured_queries)


def test_access_checks_read_the_snapshot(main_chain: Chain, django_user_model: Any) -> None:
    alice = django_user_model.objects.create_user(username="alice2", password="pw-x-12345")
    group = Group.objects.create(name="team")
    main_chain.allowed_groups.add(group)
    principal = Principal(user_id=alice.pk)
    member = Principal(user_id=alice.pk, group_ids=frozenset({group.pk}))
    snapshot.current()
    with CaptureQueriesContext(connection) as queries:
        assert refusal(AuditRequest(task="t", input_text="x", chain="main", principal=principal))
        assert not refusal(AuditRequest(task="t", input_text="x", chain="main", principal=member))
        assert refusal(AuditRequest(task="t", input_text="x", provider="a", principal=principal))
        denied = route(AuditRequest(task="t", input_text="x", principal=principal), persist=False)
    assert queries.captured_queries == []
    assert denied.result.provider == "mock"
    assert {s["reason"] for s in denied.metadata.skipped_providers} == {"not_allowed"}


def test_snapshot_is_built_once_and_is_read_only(main_chain: Chain) -> None:
    first = snapshot.current()
    assert snapshot.current() is first
    assert first.default_chain is not None and first.default_chain.name == "main"
    assert first.chain("main") is first.default_chain
    assert first.default_chain.provider_names() == [("a", ""), ("b", "")]
    assert sorted(first.providers) == ["a", "b"]
    with pytest.raises(TypeError):
        first.providers["c"] = first.providers["a"]  # type: ignore[index]


def test_key_presence_is_read_at_call_time(main_chain: Chain, monkeypatch: Any) -> None:
    assert served_by() == "a"
    monkeypatch.delenv("TEST_PROVIDER_KEY")  # no row changes, no version bump
    routed = route(REQUEST, persist=False)
    assert [(s["provider"], s["reason"]) for s in routed.metadata.skipped_providers] == [
        ("a", "missing_key"),
        ("b", "missing_key"),
    ]


# --- a change in this process: seen by the next request ----------------------------------


def _save_disabled() -> None:
    row = Provider.objects.get(name="a")
    row.enabled = False
    row.save()


def _reorder() -> None:
    ChainEntry.objects.filter(provider__name="a").update(position=10)


def _bulk_create_rule() -> None:
    chain = Chain.objects.create(name="only-b")
    ChainEntry.objects.bulk_create(
        [ChainEntry(chain=chain, provider=Provider.objects.get(name="b"), position=0)]
    )
    RoutingRule.objects.create(name="sum", task_glob="summ*", chain=chain)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_save_disabled, id="save"),
        pytest.param(lambda: Provider.objects.filter(name="a").update(enabled=False), id="update"),
        pytest.param(
            lambda: Provider.objects.filter(name="a").update(api_key_env="UNSET_VAR_X"),
            id="key-variable",
        ),
        pytest.param(
            lambda: ChainEntry.objects.filter(provider__name="a").update(enabled=False),
            id="entry-update",
        ),
        pytest.param(
            lambda: ChainEntry.objects.filter(provider__name="a").delete(), id="entry-delete"
        ),
        pytest.param(_reorder, id="reorder"),
        pytest.param(_bulk_create_rule, id="rule-and-bulk-create"),
    ],
)
def test_a_change_in_this_process_is_seen_by_the_next_request(
    main_chain: Chain, clock: FakeClock, change: Callable[[], Any]
) -> None:
    assert served_by() == "a"
    change()
    assert served_by() == "b"  # same clock instant: no version check was due


def test_llm_routing_apply_is_seen_by_the_next_request(main_chain: Chain, clock: Any) -> None:
    assert served_by() == "a"
    apply(
        """
[providers.a]
kind = "scripted"
model = "a-model"
api_key_env = "TEST_PROVIDER_KEY"
[providers.b]
kind = "scripted"
model = "b-model"
api_key_env = "TEST_PROVIDER_KEY"
[chains.main]
is_default = true
[[chains.main.entries]]
provider = "b"
[[chains.main.entries]]
provider = "a"
"""
    )
    assert served_by() == "b"


def test_chain_access_change_is_seen_at_once(main_chain: Chain, django_user_model: Any) -> None:
    bob = django_user_model.objects.create_user(username="bob", password="pw-bob-12345")
    principal = Principal(user_id=bob.pk)
    request = AuditRequest(task="t", input_text="x", chain="main", principal=principal)
    assert refusal(request) is None
    other = django_user_model.objects.create_user(username="carol", password="pw-carol-123")
    main_chain.allowed_users.add(other)
    refused = refusal(request)  # the 404 of a chain that does not exist (access.refusal)
    assert refused is not None and refused.status == 404
    assert refused.message == "No chain 'main' that you may use."
    main_chain.allowed_users.add(bob)
    assert refusal(request) is None


# --- a change in another process: seen within the check interval --------------------------


def test_another_process_change_is_seen_after_the_check_interval(
    main_chain: Chain, clock: FakeClock
) -> None:
    assert served_by() == "a"
    edit_behind_the_apps_back(
        "UPDATE llm_routing_provider SET enabled = %s WHERE name = %s", False, "a"
    )
    bump_shared_version()
    clock.advance(snapshot.CHECK_INTERVAL_S - 0.01)
    assert served_by() == "a"  # not checked yet: the snapshot is trusted
    clock.advance(0.01)
    assert served_by() == "b"  # checked, changed, rebuilt: live within 1 s


def test_an_unchanged_version_costs_no_rebuild(main_chain: Chain, clock: FakeClock) -> None:
    first = snapshot.current()
    clock.advance(5 * snapshot.CHECK_INTERVAL_S)
    with CaptureQueriesContext(connection) as queries:
        assert snapshot.current() is first  # one cache read, no query
    assert queries.captured_queries == []


def test_a_missed_bump_heals_after_the_max_age(main_chain: Chain, clock: FakeClock) -> None:
    assert served_by() == "a"
    edit_behind_the_apps_back(
        "UPDATE llm_routing_provider SET enabled = %s WHERE name = %s", False, "a"
    )
    clock.advance(snapshot.MAX_AGE_S - 0.1)
    assert served_by() == "a"
    clock.advance(0.1)
    assert served_by() == "b"


def test_cache_down_falls_back_to_a_short_ttl(main_chain: Chain, clock: FakeClock) -> None:
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "broken": {"BACKEND": "tests.breaker_support.BrokenCache"},
    }
    with override_settings(CACHES=caches_setting, LLM_ROUTING={"CACHE_ALIAS": "broken"}):
        snapshot.clear()
        assert served_by() == "a"
        edit_behind_the_apps_back(
            "UPDATE llm_routing_provider SET enabled = %s WHERE name = %s", False, "a"
        )
        clock.advance(snapshot.FALLBACK_TTL_S - 0.01)
        assert served_by() == "a"
        clock.advance(0.01)
        assert served_by() == "b"  # rebuilt from the database: the bound stays 1 s


# --- async -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_acurrent_answers_inline_and_rebuilds_off_the_loop(main_chain: Chain) -> None:
    sync_snap = snapshot.current()
    assert asyncio.run(snapshot.acurrent()) is sync_snap  # nothing due: answered inline
    snapshot.changed()  # as a local save would
    rebuilt = asyncio.run(snapshot.acurrent())  # rebuilt in a worker thread
    assert rebuilt is not sync_snap and sorted(rebuilt.providers) == ["a", "b"]
    assert snapshot.current() is rebuilt
