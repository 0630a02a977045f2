"""Every scripted fault of the fake upstream, per vendor, lands in the right category.

Real HTTP over httpx to the fake server on 127.0.0.1; one adapter call per fault, sync
(httpcore) and async on each async transport (aiohttp, httpcore).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import HttpProvider
from llm_routing.types import AuditRequest
from tests.conftest import VENDOR_OF_KIND
from tests.fakes.upstream import FakeUpstream, Fault, Faults

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
REQUEST = AuditRequest(task="summarize", input_text="Some text.", instructions="Be brief.")
KEY = "sk-test-0123456789"

# (fault builder, expected class, expected http_status) — None status: no HTTP answer.
CASES: dict[str, tuple[Callable[[str], Fault], type[errors.ProviderError], int | None]] = {
    "429 retry-after seconds": (
        lambda v: Faults.rate_limit(v, retry_after="2"),
        errors.RateLimitError,
        429,
    ),
    "429 retry-after http-date": (
        lambda v: Faults.rate_limit(v, retry_after_date_in=30),
        errors.RateLimitError,
        429,
    ),
    "429 retry-after-ms": (
        lambda v: Faults.rate_limit(v, retry_after_ms="1500"),
        errors.RateLimitError,
        429,
    ),
    "500": (lambda v: Faults.unavailable(v, 500), errors.UnavailableError, 500),
    "502": (lambda v: Faults.unavailable(v, 502), errors.UnavailableError, 502),
    "503": (lambda v: Faults.unavailable(v, 503), errors.UnavailableError, 503),
    "504": (lambda v: Faults.unavailable(v, 504), errors.UnavailableError, 504),
    "529": (lambda v: Faults.overloaded(), errors.UnavailableError, 529),
    "reset before headers": (lambda v: Faults.reset(), errors.NetworkError, None),
    "closed before headers": (lambda v: Faults.close(), errors.NetworkError, None),
    "malformed json": (lambda v: Faults.malformed(), errors.ResponseError, None),
    "200 with error body": (lambda v: Faults.error_body_200(v), errors.UnavailableError, 200),
    "401 / bad key": (
        lambda v: Faults.auth(v),
        errors.AuthenticationError,
        None,  # vendor specific: 401, Gemini 400
    ),
    "400 context length": (lambda v: Faults.context_length(v), errors.ContextLengthError, 400),
    "content policy": (lambda v: Faults.content_policy(v), errors.ContentPolicyError, None),
    "400 invalid request": (lambda v: Faults.invalid_request(v), errors.InvalidRequestError, 400),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_fault_classification(
    kind: str,
    case: str,
    fake_upstream: FakeUpstream,
    make_adapter: Callable[..., HttpProvider],
) -> None:
    builder, expected, status = CASES[case]
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, builder(vendor))
    adapter = make_adapter(kind)
    with pytest.raises(errors.ProviderError) as caught:
        adapter.complete(REQUEST, api_key=KEY, timeout=5.0)
    exc = caught.value
    assert type(exc) is expected, f"{case}: {type(exc).__name__}: {exc.message}"
    if status is not None:
        assert exc.http_status == status
    assert len(fake_upstream.requests_for(vendor)) == 1
    assert fake_upstream.pending(vendor) == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_fault_classification_async(
    kind: str,
    case: str,
    async_transport: str,
    fake_upstream: FakeUpstream,
    make_adapter: Callable[..., HttpProvider],
) -> None:
    """The same matrix through ``acomplete``: the same class and status on both
    async transports."""
    builder, expected, status = CASES[case]
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, builder(vendor))
    adapter = make_adapter(kind)

    async def go() -> None:
        try:
            await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)
        finally:
            await adapter.aclose()

    with pytest.raises(errors.ProviderError) as caught:
        asyncio.run(go())
    exc = caught.value
    assert type(exc) is expected, f"{case}: {type(exc).__name__}: {exc.message}"
    if status is not None:
        assert exc.http_status == status
    assert len(fake_upstream.requests_for(vendor)) == 1
    assert fake_upstream.pending(vendor) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_retry_after_forms_reach_the_error(
    kind: str, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    adapter = make_adapter(kind)
    fake_upstream.script(
        vendor,
        Faults.rate_limit(vendor, retry_after="2"),
        Faults.rate_limit(vendor, retry_after_ms="1500"),
        Faults.rate_limit(vendor, retry_after_date_in=30),
        Faults.rate_limit(vendor),
    )
    seen = []
    for _ in range(4):
        with pytest.raises(errors.RateLimitError) as caught:
            adapter.complete(REQUEST, api_key=KEY, timeout=5.0)
        seen.append(caught.value.retry_after)
    assert seen[0] == 2.0
    assert seen[1] == 1.5
    assert seen[2] is not None and 27 <= seen[2] <= 31  # HTTP-date has 1 s resolution
    assert seen[3] is None


@pytest.mark.parametrize("kind", KINDS)
def test_accept_and_never_answer_is_a_timeout(
    kind: str, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.hang())
    adapter = make_adapter(kind)
    # The row allows 5 s, the request-wide deadline leaves 0.3 s: the smaller wins.
    with pytest.raises(errors.ProviderTimeoutError):
        adapter.complete(REQUEST, api_key=KEY, timeout=0.3)
    assert len(fake_upstream.requests_for(vendor)) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_slow_first_byte(
    kind: str, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    adapter = make_adapter(kind, timeout_s=0.3)
    fake_upstream.script(vendor, Faults.slow(1.0))
    with pytest.raises(errors.ProviderTimeoutError):
        adapter.complete(REQUEST, api_key=KEY, timeout=5.0)
    # Slow but inside the row's timeout: a normal answer.
    patient = make_adapter(kind, name=f"{kind}-patient", timeout_s=5.0)
    fake_upstream.script(vendor, Faults.slow(0.2))
    result = patient.complete(REQUEST, api_key=KEY, timeout=5.0)
    assert result.ok and result.output


@pytest.mark.parametrize("kind", KINDS)
def test_connection_refused_is_network(
    kind: str, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter(kind, base_url="http://127.0.0.1:9")  # discard port: closed
    with pytest.raises(errors.NetworkError):
        adapter.complete(REQUEST, api_key=KEY, timeout=2.0)
