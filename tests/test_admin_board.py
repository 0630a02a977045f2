"""The breaker board: every (provider, model) circuit, reset and force-open logged to the
admin history, /health/ agreeing; the provider page's key, capabilities and circuit."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse

from llm_routing.models import ChainEntry, Provider
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import OPEN, Circuit

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

BOARD = "admin:llm_routing_circuits"


@pytest.fixture
def rows(scripted: Any, key_env: str, clock: Any) -> dict[str, Provider]:
    a = make_provider("a", supports_streaming=True)
    b = make_provider("b")
    offline = Provider.objects.create(name="offline", kind="mock", model="m")
    chain = make_chain("main", [a, b], is_default=True)
    ChainEntry.objects.filter(chain=chain, provider=b).update(model="b-big")
    now = clock()
    breaker.store.save(
        Circuit(
            provider="a",
            model="a-model",
            state=OPEN,
            failures=3,
            level=2,
            opened_at=now,
            open_until=now + 40,
            last_error_at=now,
            last_error_category="unavailable",
            last_http_status=503,
        )
    )
    return {"a": a, "b": b, "offline": offline}


def board_rows(html: str) -> dict[tuple[str, str], str]:
    body = html[html.index('id="llmr-circuits"') :]
    body = body[: body.index("</table>")]
    out = {}
    for chunk in body.split('<tr class="llmr-circuit-row"')[1:]:
        provider = chunk.split('data-provider="')[1].split('"')[0]
        model = chunk.split('data-model="')[1].split('"')[0]
        out[(provider, model)] = chunk
    return out


def health_state(client: Any, name: str) -> str:
    """The circuit state in /health/'s operator view (staff: every provider)."""
    providers = {p["name"]: p for p in client.get("/health/").json()["providers"]}
    return str(providers[name]["health"]["state"])


def test_board_lists_every_circuit(admin_client, rows):
    html = admin_client.get(reverse(BOARD)).content.decode()
    found = board_rows(html)
    assert set(found) == {("a", "a-model"), ("b", "b-model"), ("b", "b-big")}
    a = found[("a", "a-model")]
    assert ">open (skipped)<" in a and "<td>3</td>" in a and "<td>2</td>" in a
    assert "unavailable (503)" in a and "(in 40 s)" in a
    assert (
        ">closed (healthy)<" in found[("b", "b-big")] and "chain override" in found[("b", "b-big")]
    )
    assert "offline" in html[html.index("</table>") :]  # listed as having no circuit


def test_reset_closes_the_circuit_logs_it_and_health_agrees(admin_client, api, rows):
    assert health_state(admin_client, "a") == "open"
    response = admin_client.post(
        reverse(BOARD), {"action": "reset", "provider": "a", "model": "a-model"}
    )
    assert response.status_code == 302
    assert breaker.store.load("a", "a-model").phase(breaker.store.clock()) == "closed"
    assert health_state(admin_client, "a") == "closed"
    entry = LogEntry.objects.get(object_id=str(rows["a"].pk))
    assert "Reset the circuit of model 'a-model'" in entry.get_change_message()


def test_force_open_with_duration(admin_client, api, rows, clock):
    response = admin_client.post(
        reverse(BOARD),
        {"action": "force_open", "provider": "b", "model": "b-big", "seconds": "120"},
    )
    assert response.status_code == 302
    circuit = breaker.store.load("b", "b-big")
    assert circuit.phase(clock()) == OPEN
    assert circuit.open_until == pytest.approx(clock() + 120)
    assert breaker.store.load("b", "b-model").phase(clock()) == "closed"
    entry = LogEntry.objects.get(object_id=str(rows["b"].pk))
    assert "open for 120 s" in entry.get_change_message()
    clock.advance(121)
    assert circuit.phase(clock()) == "half_open"


@pytest.mark.parametrize(
    "data",
    [
        {"action": "force_open", "provider": "b", "model": "b-model", "seconds": "0"},
        {"action": "force_open", "provider": "b", "model": "b-model", "seconds": "soon"},
        {"action": "reset", "provider": "b", "model": "not-a-model"},
        {"action": "reset", "provider": "offline", "model": "m"},
        {"action": "explode", "provider": "b", "model": "b-model"},
    ],
)
def test_bad_actions_are_messages_not_changes(admin_client, rows, data, clock):
    response = admin_client.post(reverse(BOARD), data, follow=True)
    assert response.status_code == 200
    assert 'class="error"' in response.content.decode()
    assert breaker.store.load("b", "b-model").phase(clock()) == "closed"
    assert LogEntry.objects.count() == 0


def test_view_only_staff_sees_the_board_without_actions(client, django_user_model, rows):
    user = django_user_model.objects.create_user("viewer", password="pw-view-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_provider"))
    client.force_login(user)
    html = client.get(reverse(BOARD)).content.decode()
    assert ">open (skipped)<" in html and "Force open" not in html
    post = client.post(reverse(BOARD), {"action": "reset", "provider": "a", "model": "a-model"})
    assert post.status_code == 403
    assert breaker.store.load("a", "a-model").state == OPEN


def test_provider_page_shows_key_capabilities_and_circuit(admin_client, rows, key_env):
    a, offline = rows["a"], rows["offline"]
    html = admin_client.get(reverse("admin:llm_routing_provider_change", args=[a.pk])).content
    text = html.decode()
    assert ">present<" in text and key_env not in text
    assert "streaming: yes" in text and "structured_output: no" in text
    assert "llmr-circuit-open" in text
    page = admin_client.get(reverse("admin:llm_routing_provider_change", args=[offline.pk]))
    assert "llmr-circuit-n-a" in page.content.decode()
    changelist = admin_client.get(reverse("admin:llm_routing_provider_changelist"))
    assert reverse(BOARD) in changelist.content.decode()
