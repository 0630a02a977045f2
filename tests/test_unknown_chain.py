"""A chain name that does not exist is an error naming it everywhere — ``/audit/``,
explain (API and admin page), the Python API, ``/v1`` — never a silent fall back to the
default chain. Over HTTP it is the 404 of access.may_see: a chain that does not exist and
one the caller may not use get the same status and words. An unknown *provider* keeps
its behaviour: an ``unknown_provider`` skip, then the rest of the chain. On main before
this branch, the /audit/, admin-page and Python-API tests fail (the default chain
answered, or ``/audit/`` refused ``chain`` as an unknown field)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from llm_routing import achat, audit, chat
from llm_routing.service import execute
from llm_routing.types import AuditRequest

from .docs_blocks import DOCS, blocks

pytestmark = pytest.mark.django_db

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_OPENAI_API_KEY", raising=False)
    call_command("seed_demo", stdout=io.StringIO())


def _names_it(messages: list[str]) -> bool:
    return any("'nonexistent'" in m for m in messages)


HIDDEN = "No chain 'nonexistent' that you may use."


@pytest.mark.usefixtures("demo")
def test_audit_answers_404_naming_the_chain(api: APIClient, django_user_model: Any) -> None:
    body = {"task": "summarize", "input_text": "x", "chain": "nonexistent"}
    response = api.post("/audit/", body, format="json")
    assert response.status_code == 404
    assert response.json()["detail"] == HIDDEN
    # A chain this caller may not use reads the same (no enumeration of chain names).
    from llm_routing.models import Chain

    secret = Chain.objects.get(name="cheap")
    secret.allowed_users.add(django_user_model.objects.create_user("zed", password="pw-zed-12"))
    hidden = api.post("/audit/", {**body, "chain": "cheap"}, format="json")
    assert hidden.status_code == 404
    assert hidden.json()["detail"] == HIDDEN.replace("nonexistent", "cheap")


@pytest.mark.usefixtures("demo")
def test_audit_routes_through_a_chain_named_by_the_caller(api: APIClient) -> None:
    body = {"task": "summarize", "input_text": "x", "chain": "cheap"}
    meta = api.post("/audit/", body, format="json").json()["routing_metadata"]
    assert (meta["router_mode"], meta["chain_name"], meta["chain"]) == ("chain", "cheap", ["mock"])


@pytest.mark.usefixtures("demo")
def test_explain_api_answers_404_naming_the_chain(api: APIClient) -> None:
    response = api.get("/audit/explain/", {"task": "summarize", "chain": "nonexistent"})
    assert response.status_code == 404
    assert response.json()["detail"] == HIDDEN


@pytest.mark.usefixtures("demo")
def test_explain_admin_page_shows_the_error_and_no_plan(admin_client: Any) -> None:
    url = reverse("admin:llm_routing_explain")
    page = admin_client.get(url, {"task": "summarize", "chain": "nonexistent"})
    assert page.status_code == 200
    assert page.context["explanation"] is None
    assert any(label == "Chain" and "'nonexistent'" in m for label, m in page.context["errors"])
    assert "There is no chain named &#x27;nonexistent&#x27;." in page.content.decode()


@pytest.mark.usefixtures("demo")
def test_python_api_raises_naming_the_chain() -> None:
    with pytest.raises(ValidationError) as chat_error:
        chat(HI, chain="nonexistent")
    assert _names_it(chat_error.value.message_dict["chain"])
    with pytest.raises(ValidationError) as audit_error:
        audit(task="summarize", input_text="x", chain="nonexistent")
    assert _names_it(audit_error.value.message_dict["chain"])
    with pytest.raises(ValidationError) as stream_error:
        chat(HI, chain="nonexistent", stream=True)
    assert "chain" in stream_error.value.message_dict
    # A request built by hand is checked before routing, too.
    with pytest.raises(ValidationError) as execute_error:
        execute(AuditRequest(task="summarize", input_text="x", chain="nonexistent"))
    assert _names_it(execute_error.value.message_dict["chain"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("demo")
def test_async_python_api_raises_naming_the_chain() -> None:
    with pytest.raises(ValidationError) as error:
        asyncio.run(achat(HI, chain="nonexistent"))
    assert _names_it(error.value.message_dict["chain"])


@pytest.mark.usefixtures("demo")
def test_v1_answers_404_for_an_unknown_model(api: APIClient) -> None:
    response = api.post(
        "/v1/chat/completions", {"model": "nonexistent", "messages": HI}, format="json"
    )
    assert response.status_code == 404
    assert "'nonexistent'" in response.json()["error"]["message"]


@pytest.mark.usefixtures("demo")
def test_an_unknown_provider_is_still_a_skip_then_the_rest_of_the_chain() -> None:
    routed = audit(task="summarize", input_text="x", provider="nonexistent")
    assert routed.result.status == "ok"
    assert {"provider": "nonexistent", "reason": "unknown_provider"} in (
        routed.metadata.skipped_providers
    )


def test_quickstart_chat_examples_run_on_the_quickstart_configuration(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/quickstart.md's chat blocks (not marked ``run``: they need its routing.toml)
    run against that file's chains (they named `default`, which the file lacks)."""
    page = DOCS / "quickstart.md"
    toml = next(b for b in blocks(page) if b.action == "write" and b.arg == "routing.toml")
    config = tmp_path / "routing.toml"
    config.write_text(toml.text, encoding="utf-8")
    call_command("llm_routing_apply", str(config), stdout=io.StringIO())
    chat_blocks = [b for b in blocks(page) if b.lang == "python" and "chat(" in b.text]
    assert len(chat_blocks) >= 2
    namespace: dict[str, object] = {"__name__": "quickstart_chat"}
    for block in chat_blocks:
        exec(compile(block.text, block.where, "exec"), namespace)
    assert namespace["final"].metadata.chain_name == "main"  # type: ignore[attr-defined]
    assert "served by staging" in capsys.readouterr().out
