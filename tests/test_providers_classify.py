"""Classification of HTTP answers and httpx exceptions (llm_routing.providers.classify)."""

from __future__ import annotations

from email.utils import formatdate

import httpx
import pytest

from llm_routing import errors
from llm_routing.providers.classify import (
    classify_http_error,
    from_httpx_exception,
    parse_retry_after,
    status_in_text,
)


class TestRetryAfter:
    def test_delta_seconds(self) -> None:
        assert parse_retry_after({"Retry-After": "7"}) == 7.0
        assert parse_retry_after({"retry-after": " 1.5 "}) == 1.5

    def test_http_date(self) -> None:
        now = 1_700_000_000.0
        header = formatdate(now + 30, usegmt=True)
        assert parse_retry_after({"Retry-After": header}, now=now) == pytest.approx(30.0)

    def test_http_date_in_the_past_means_now(self) -> None:
        now = 1_700_000_000.0
        assert parse_retry_after({"Retry-After": formatdate(now - 60, usegmt=True)}, now=now) == 0

    def test_retry_after_ms_wins(self) -> None:
        assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25

    def test_httpx_headers(self) -> None:
        assert parse_retry_after(httpx.Headers({"Retry-After": "3"})) == 3.0

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"retry-after": "soon"},
            {"retry-after": "-4"},
            {"retry-after-ms": "x"},
            {"retry-after": "nan"},
            {"retry-after": "inf"},
        ],
    )
    def test_unusable_values_are_ignored(self, headers: dict[str, str]) -> None:
        assert parse_retry_after(headers) is None

    def test_bad_ms_falls_back_to_seconds(self) -> None:
        assert parse_retry_after({"retry-after-ms": "-1", "retry-after": "2"}) == 2.0


class TestStatusInText:
    @pytest.mark.parametrize(
        "text, expected",
        [
            ("upstream returned 503 Service Unavailable", 503),
            ("error 429: slow down", 429),
            ("(500)", 500),
            ("processed 15000 tokens", None),
            ("model gpt-4-0500", None),
            ("took 5.003 seconds", None),
            ("id=abc500def", None),
            ("v1.500.2", None),
            ("", None),
            # issue 11: a sentence-final status counts; a count of something does not
            ("Upstream returned 503.", 503),
            ("Upstream returned 503. Try later", 503),
            ("status 502, retrying", 502),
            ("you asked for 500 tokens", None),
            ("at most 400 characters allowed", None),
        ],
    )
    def test_word_boundaries_only(self, text: str, expected: int | None) -> None:
        assert status_in_text(text) == expected


@pytest.mark.parametrize(
    "status, codes, message, expected",
    [
        (429, ["rate_limit_exceeded"], "", errors.RateLimitError),
        (429, [], "", errors.RateLimitError),
        (429, ["RESOURCE_EXHAUSTED"], "", errors.RateLimitError),
        (500, [], "", errors.UnavailableError),
        (502, [], "", errors.UnavailableError),
        (503, ["UNAVAILABLE"], "", errors.UnavailableError),
        (504, ["DEADLINE_EXCEEDED"], "", errors.UnavailableError),
        (529, ["overloaded_error"], "Overloaded", errors.UnavailableError),
        (408, [], "", errors.UnavailableError),
        (401, ["invalid_api_key"], "", errors.AuthenticationError),
        (403, ["permission_error"], "", errors.AuthenticationError),
        (
            400,
            ["INVALID_ARGUMENT", "API_KEY_INVALID"],
            "API key not valid.",
            errors.AuthenticationError,
        ),
        (400, ["context_length_exceeded"], "", errors.ContextLengthError),
        (400, ["invalid_request_error"], "prompt is too long: 1 > 0", errors.ContextLengthError),
        (
            400,
            ["INVALID_ARGUMENT"],
            "The input token count (9) exceeds the maximum number of tokens allowed (8).",
            errors.ContextLengthError,
        ),
        (400, ["content_policy_violation"], "", errors.ContentPolicyError),
        # issue 11: an in-band error (200 or no HTTP answer) read from its message
        (200, [], "Upstream returned 503.", errors.UnavailableError),
        (200, [], "you asked for 500 tokens", errors.ResponseError),
        (
            400,
            ["invalid_request_error"],
            "blocked by content filtering policy",
            errors.ContentPolicyError,
        ),
        (400, ["invalid_request_error"], "bad temperature", errors.InvalidRequestError),
        (404, ["not_found_error"], "", errors.InvalidRequestError),
        (413, ["request_too_large"], "", errors.InvalidRequestError),
        (422, [], "", errors.InvalidRequestError),
        # 200 with an error body: the body's numeric code or the message stands in.
        (200, [502], "Upstream provider error", errors.UnavailableError),
        (200, [], "upstream answered 503", errors.UnavailableError),
        (200, [], "processed 15000 tokens then failed", errors.ResponseError),
        (200, ["overloaded_error"], "", errors.UnavailableError),
    ],
)
def test_classify_http_error(
    status: int, codes: list[object], message: str, expected: type[errors.ProviderError]
) -> None:
    exc = classify_http_error(status, message=message, codes=codes)
    assert type(exc) is expected
    assert exc.http_status == status
    assert exc.category == expected.category


def test_insufficient_quota_fails_over_without_retry() -> None:
    exc = classify_http_error(429, codes=["insufficient_quota"], retry_after=1.0)
    assert isinstance(exc, errors.RateLimitError)
    assert exc.transient and exc.advances
    assert not exc.retryable


def test_retry_after_is_carried_on_transient_errors() -> None:
    assert classify_http_error(429, retry_after=2.5).retry_after == 2.5
    assert classify_http_error(503, retry_after=4.0).retry_after == 4.0
    assert classify_http_error(400, retry_after=4.0).retry_after is None


def test_vendor_code_is_kept() -> None:
    exc = classify_http_error(400, codes=["context_length_exceeded", "invalid_request_error"])
    assert exc.code == "context_length_exceeded"


_REQ = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


@pytest.mark.parametrize(
    "exc, expected",
    [
        (httpx.ConnectError("refused", request=_REQ), errors.NetworkError),
        (httpx.ReadError("reset by peer", request=_REQ), errors.NetworkError),
        (httpx.WriteError("broken pipe", request=_REQ), errors.NetworkError),
        (httpx.RemoteProtocolError("disconnected", request=_REQ), errors.NetworkError),
        (httpx.ProxyError("proxy", request=_REQ), errors.NetworkError),
        (httpx.ConnectTimeout("slow", request=_REQ), errors.ProviderTimeoutError),
        (httpx.ReadTimeout("silent", request=_REQ), errors.ProviderTimeoutError),
        (httpx.PoolTimeout("pool", request=_REQ), errors.ProviderTimeoutError),
        (httpx.UnsupportedProtocol("ftp", request=_REQ), errors.InvalidRequestError),
        (httpx.InvalidURL("bad"), errors.InvalidRequestError),
        (httpx.DecodingError("gzip", request=_REQ), errors.ResponseError),
    ],
)
def test_from_httpx_exception(exc: Exception, expected: type[errors.ProviderError]) -> None:
    out = from_httpx_exception(exc)
    assert type(out) is expected
    assert "127.0.0.1" not in out.message  # never the URL


def test_error_tree_contract() -> None:
    assert errors.ProviderTimeoutError.transient and not errors.ProviderTimeoutError.retryable
    assert errors.ContextLengthError.advances and not errors.ContextLengthError.transient
    for cls in (
        errors.AuthenticationError,
        errors.InvalidRequestError,
        errors.ContentPolicyError,
        errors.ResponseError,
    ):
        assert not cls.advances and not cls.retryable and not cls.transient
    for cls in (errors.RateLimitError, errors.UnavailableError, errors.NetworkError):
        assert cls.transient and cls.retryable and cls.advances
