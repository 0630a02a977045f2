"""The failure classifier's edges, through its public functions (issue 17's mutation
run of llm_routing/providers/classify.py): status and code boundaries, which message
and code an error carries, Retry-After values of zero and below one, and the message
each httpx failure type maps to."""

from __future__ import annotations

import httpx
import pytest

from llm_routing.errors import (
    AuthenticationError,
    InvalidRequestError,
    NetworkError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ResponseError,
    UnavailableError,
)
from llm_routing.providers.classify import (
    classify_http_error,
    from_httpx_exception,
    parse_retry_after,
)


@pytest.mark.parametrize(
    ("status", "codes", "expected"),
    [
        (400, (), InvalidRequestError),  # the first client status
        (499, (), InvalidRequestError),
        (401, (), AuthenticationError),
        (403, (), AuthenticationError),
        (400, ("invalid_api_key",), AuthenticationError),  # the code alone decides
        (409, (), UnavailableError),
        (425, (), UnavailableError),
        (200, ("400",), InvalidRequestError),  # a numeric code stands in for the status
        (200, ("599",), UnavailableError),
        (200, ("600",), ResponseError),  # not an HTTP error status
        (200, ("something_else",), ResponseError),  # an error body nothing places
    ],
)
def test_status_and_code_boundaries(
    status: int, codes: tuple[str, ...], expected: type[ProviderError]
) -> None:
    assert type(classify_http_error(status, codes=codes)) is expected


def test_a_retry_after_is_carried_on_a_conflict_or_timeout_status() -> None:
    for status in (408, 409, 425):
        assert classify_http_error(status, retry_after=3.0).retry_after == 3.0


def test_the_error_carries_the_message_or_its_classs_default() -> None:
    assert classify_http_error(503, message="boom").message == "boom"
    assert classify_http_error(503).message == UnavailableError().message


def test_the_status_found_in_a_message_is_the_errors_status() -> None:
    exc = classify_http_error(None, message="upstream said 503")
    assert (type(exc), exc.http_status) == (UnavailableError, 503)


def test_the_code_is_the_first_non_numeric_non_blank_code() -> None:
    assert classify_http_error(200, codes=["503", "overloaded_error"]).code == "overloaded_error"
    assert classify_http_error(400, codes=[None, " ", ""]).code is None


def test_a_quota_answer_is_a_rate_limit_that_is_not_retried() -> None:
    exc = classify_http_error(429, codes=["insufficient_quota"])
    assert type(exc) is RateLimitError and not exc.retryable


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "0"}, 0.0),
        ({"retry-after-ms": "0.5"}, 0.0005),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "0.5"}, 0.5),
    ],
)
def test_retry_after_values_of_zero_and_below_one(headers: dict[str, str], seconds: float) -> None:
    assert parse_retry_after(headers) == seconds


@pytest.mark.parametrize(
    ("exc", "expected", "message"),
    [
        (
            httpx.ReadTimeout("t"),
            ProviderTimeoutError,
            "The provider did not answer in time (ReadTimeout).",
        ),
        (
            httpx.InvalidURL("u"),
            InvalidRequestError,
            "The provider URL is not usable (InvalidURL).",
        ),
        (
            httpx.DecodingError("d"),
            ResponseError,
            "The provider's response could not be decoded (DecodingError).",
        ),
        (
            httpx.ConnectError("c"),
            NetworkError,
            "The connection to the provider failed (ConnectError).",
        ),
        (ValueError("v"), NetworkError, "The HTTP request failed (ValueError)."),
    ],
)
def test_each_httpx_failure_names_its_type_only(
    exc: Exception, expected: type[ProviderError], message: str
) -> None:
    mapped = from_httpx_exception(exc)
    assert (type(mapped), mapped.message) == (expected, message)


def test_a_client_error_whose_message_says_the_key_is_wrong_is_an_authentication_error() -> None:
    exc = classify_http_error(400, message="Incorrect API key provided: sk-...")
    assert type(exc) is AuthenticationError
