"""Schema-driven fuzzing of the HTTP API (schemathesis over ``/api/schema/``).

Every operation of the OpenAPI schema (``/audit/``, ``/audit/jobs/{job_id}/``,
``/health/``, ``/v1/chat/completions``, ``/v1/models`` …) gets generated requests —
valid and invalid — sent in-process through Django's WSGI application as an
authenticated user. A run fails on any 5xx, on a response that does not match the
schema's documented shape for its status, or on a wrong content type.

Bounded and reproducible by default (a fixed seed, ``LLMR_FUZZ_EXAMPLES`` cases per
operation, 25 unless set); ``.ci/run`` runs it as its own section. Longer runs: see
docs/fuzzing.md.
"""

from __future__ import annotations

import os

import hypothesis
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.wsgi import get_wsgi_application
from rest_framework.authtoken.models import Token
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

EXAMPLES = int(os.environ.get("LLMR_FUZZ_EXAMPLES", "25"))
SEED = int(os.environ.get("LLMR_FUZZ_SEED", "20261203"))
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


# Loaded once at collection (pytest-django has configured Django by then); requests go
# in-process to Django's WSGI application at http://localhost.
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


@pytest.fixture(autouse=True)
def _no_throttles(settings):
    # Every generated case should reach the code under test, not a 429.
    settings.LLM_ROUTING = {"API_THROTTLE_RATES": {"user": None, "anon": None}}


@pytest.fixture
def token(django_user_model) -> str:
    user = get_user_model().objects.create_user("fuzzer", password="pw-fuzzer-123")
    return Token.objects.create(user=user).key


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@hypothesis.seed(SEED)
@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    database=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_api_never_5xx_and_matches_its_schema(case, token):
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)
