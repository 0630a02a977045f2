"""The Chain page's inline entries: any reorder, insert or delete saves in one
transaction without tripping the (chain, position) / (chain, provider) constraints,
and invalid edits come back as form errors, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from llm_routing.models import Chain, ChainEntry, Provider

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db


def chain_form(chain: Chain, rows: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The POST body of the Chain change page with ``rows`` as the inline entries.
    A row with ``id`` edits that entry; ``DELETE`` marks it for deletion."""
    initial = sum(1 for r in rows if r.get("id"))
    data: dict[str, Any] = {
        "name": chain.name,
        "description": chain.description,
        "stream_mode": chain.stream_mode,
        "entries-TOTAL_FORMS": str(len(rows)),
        "entries-INITIAL_FORMS": str(initial),
        "entries-MIN_NUM_FORMS": "0",
        "entries-MAX_NUM_FORMS": "1000",
    }
    if chain.is_default:
        data["is_default"] = "on"
    data.update(fields)
    for i, row in enumerate(rows):
        prefix = f"entries-{i}-"
        data[prefix + "id"] = str(row.get("id", ""))
        data[prefix + "chain"] = str(chain.pk)
        data[prefix + "position"] = str(row["position"])
        data[prefix + "provider"] = str(row["provider"])
        data[prefix + "model"] = row.get("model", "")
        if row.get("enabled", True):
            data[prefix + "enabled"] = "on"
        if row.get("DELETE"):
            data[prefix + "DELETE"] = "on"
        for key in ("step", "weight", "strategy"):
            if key in row:
                data[prefix + key] = str(row[key])
    return data


def order(chain: Chain) -> list[tuple[int, str]]:
    return [(e.position, e.provider.name) for e in chain.entries.order_by("position")]


@pytest.fixture
def three(scripted: Any, key_env: str) -> tuple[Chain, list[Provider], list[ChainEntry]]:
    providers = [make_provider(n) for n in ("a", "b", "c")]
    chain = make_chain("main", providers[:2])
    entries = list(chain.entries.order_by("position"))
    return chain, providers, entries


def post(admin_client: Any, chain: Chain, rows: list[dict[str, Any]], **fields: Any) -> Any:
    url = reverse("admin:llm_routing_chain_change", args=[chain.pk])
    return admin_client.post(url, chain_form(chain, rows, **fields))


def test_swap_positions_saves(admin_client, three):
    chain, (a, b, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 1, "provider": a.pk},
            {"id": eb.pk, "position": 0, "provider": b.pk},
        ],
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert order(chain) == [(0, "b"), (1, "a")]
    # The entries keep their identity (admin history, links).
    assert set(chain.entries.values_list("pk", flat=True)) == {ea.pk, eb.pk}


def test_swap_providers_between_rows_saves(admin_client, three):
    chain, (a, b, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 0, "provider": b.pk},
            {"id": eb.pk, "position": 1, "provider": a.pk},
        ],
    )
    assert response.status_code == 302
    assert order(chain) == [(0, "b"), (1, "a")]


def test_insert_at_top_and_delete_in_one_save(admin_client, three):
    chain, (a, b, c), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 1, "provider": a.pk},
            {"id": eb.pk, "position": 1, "provider": b.pk, "DELETE": True},
            {"position": 0, "provider": c.pk},
        ],
    )
    assert response.status_code == 302
    assert order(chain) == [(0, "c"), (1, "a")]


def test_reuse_a_deleted_entrys_position_and_provider(admin_client, three):
    chain, (a, b, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 0, "provider": a.pk, "DELETE": True},
            {"id": eb.pk, "position": 1, "provider": b.pk},
            {"position": 0, "provider": a.pk},
        ],
    )
    assert response.status_code == 302
    assert order(chain) == [(0, "a"), (1, "b")]
    assert not ChainEntry.objects.filter(pk=ea.pk).exists()


def test_same_provider_twice_is_a_form_error(admin_client, three):
    chain, (a, _, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 0, "provider": a.pk},
            {"id": eb.pk, "position": 1, "provider": a.pk},
        ],
    )
    assert response.status_code == 200
    assert "listed twice" in response.content.decode()
    assert order(chain) == [(0, "a"), (1, "b")]


def test_same_position_twice_is_a_form_error(admin_client, three):
    chain, (a, b, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 3, "provider": a.pk},
            {"id": eb.pk, "position": 3, "provider": b.pk},
        ],
    )
    assert response.status_code == 200
    assert "share position 3" in response.content.decode()
    assert order(chain) == [(0, "a"), (1, "b")]


def test_default_chain_without_entries_is_a_form_error(admin_client, three):
    chain, (a, b, _), (ea, eb) = three
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 0, "provider": a.pk, "DELETE": True},
            {"id": eb.pk, "position": 1, "provider": b.pk, "DELETE": True},
        ],
        is_default="on",
    )
    assert response.status_code == 200
    assert "default chain needs at least one entry" in response.content.decode()
    chain.refresh_from_db()
    assert not chain.is_default
    assert order(chain) == [(0, "a"), (1, "b")]


def test_inline_rows_are_labelled_by_position_and_provider(admin_client, three):
    chain, _, _ = three
    html = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk])).content
    text = html.decode()
    assert f"{chain.pk}#0" not in text
    assert "main: a at position 0" in text and "main: b at position 1" in text


def test_new_entry_rows_default_to_the_next_free_position(admin_client, three):
    chain, _, _ = three
    html = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk])).content
    text = html.decode()
    assert 'name="entries-2-position" value="2"' in text
    add = admin_client.get(reverse("admin:llm_routing_chain_add")).content.decode()
    assert 'name="entries-0-position" value="0"' in add


def test_chain_page_has_drag_handles_self_hosted(admin_client, three):
    chain, _, _ = three
    text = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk])).content
    html = text.decode()
    assert "llm_routing/admin/chain_order.js" in html
    assert "cdn" not in html.lower()


def test_an_admin_reorder_is_routed_by_the_next_request(admin_client, three):
    # The config snapshot (llm_routing.snapshot) sees the admin's two-phase save at once.
    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    chain, (a, b, _), (ea, eb) = three
    request = AuditRequest(task="t", input_text="x", chain="main")
    assert route(request, persist=False).result.provider == "a"
    response = post(
        admin_client,
        chain,
        [
            {"id": ea.pk, "position": 1, "provider": a.pk},
            {"id": eb.pk, "position": 0, "provider": b.pk},
        ],
    )
    assert response.status_code == 302
    assert route(request, persist=False).result.provider == "b"


def test_steps_are_edited_and_shown_grouped(admin_client, three):
    chain, providers, entries = three
    a, b, c = providers
    rows = [
        {"id": entries[0].pk, "position": 0, "provider": a.pk, "step": 0, "weight": "1",
         "strategy": "weighted"},
        {"id": entries[1].pk, "position": 1, "provider": b.pk, "step": 0, "weight": "0.25",
         "strategy": "weighted"},
        {"position": 2, "provider": c.pk},
    ]  # fmt: skip
    response = post(admin_client, chain, rows)
    assert response.status_code == 302, response.content[:2000]
    assert list(chain.entries.order_by("position").values_list("step", "weight", "strategy")) == [
        (0, 1.0, "weighted"),
        (0, 0.25, "weighted"),
        (None, 1.0, ""),
    ]
    page = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk]))
    assert "weighted(a 1, b 0.25) → c" in page.content.decode()
    listing = admin_client.get(reverse("admin:llm_routing_chain_changelist"))
    assert "weighted(a 1, b 0.25) → c" in listing.content.decode()


def test_a_step_with_two_strategies_is_a_form_error(admin_client, three):
    chain, providers, entries = three
    rows = [
        {"id": entries[0].pk, "position": 0, "provider": providers[0].pk, "step": 3,
         "strategy": "cost"},
        {"id": entries[1].pk, "position": 1, "provider": providers[1].pk, "step": 3,
         "strategy": "latency"},
    ]  # fmt: skip
    response = post(admin_client, chain, rows)
    assert response.status_code == 200
    assert "Step 3 has entries with different strategies (cost, latency)" in (
        response.content.decode()
    )


def test_hedge_after_ms_is_edited_on_the_chain_page(admin_client, three):
    chain, _providers, entries = three
    rows = [{"id": e.pk, "position": e.position, "provider": e.provider_id} for e in entries]
    page = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk]))
    assert b'name="hedge_after_ms"' in page.content
    assert post(admin_client, chain, rows, hedge_after_ms="p95").status_code == 302
    assert Chain.objects.get(pk=chain.pk).hedge_after_ms == "p95"
    assert post(admin_client, chain, rows, hedge_after_ms="400").status_code == 302
    assert Chain.objects.get(pk=chain.pk).hedge_after_ms == "400"
    refused = post(admin_client, chain, rows, hedge_after_ms="fast")
    assert refused.status_code == 200 and b"milliseconds" in refused.content
    assert Chain.objects.get(pk=chain.pk).hedge_after_ms == "400"
