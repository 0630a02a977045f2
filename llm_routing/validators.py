"""Model-field validators: environment-variable names and outbound URLs."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.utils.deconstruct import deconstructible

from .conf import routing_settings

__all__ = [
    "BUILTIN_DENIED_ENV_NAMES",
    "BUILTIN_DENIED_ENV_PATTERNS",
    "validate_api_key_env",
    "validate_base_url",
]

ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")

# Names that hold secrets of the deployment itself (or steer the process) and must
# never be handed to an outbound HTTP call as a provider key.
BUILTIN_DENIED_ENV_NAMES = frozenset(
    {
        "SECRET_KEY",
        "DJANGO_SECRET_KEY",
        "DATABASE_URL",
        "CACHE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND",
        "EMAIL_URL",
        "EMAIL_HOST_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "DJANGO_SETTINGS_MODULE",
        "PATH",
        "HOME",
        "PWD",
        "USER",
        "SHELL",
        "PYTHONPATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PGPASSWORD",
        "POSTGRES_PASSWORD",
    }
)


# Shell-style patterns for the same (fnmatch, case-sensitive on the upper-case name):
# whatever is named like a password, a secret, a connection string or a DSN. Provider
# keys are named ``*_API_KEY`` / ``*_TOKEN``, which none of these match.
BUILTIN_DENIED_ENV_PATTERNS = (
    "*PASSWORD*",
    "*PASSWD*",
    "*PASSPHRASE*",
    "*SECRET*",
    "*PRIVATE_KEY*",
    "*_DSN",
    "*_URL",
    "*_URI",
    "DATABASE*",
)


def denied_env_names() -> frozenset[str]:
    extra = {str(n).upper() for n in routing_settings.DENIED_KEY_ENV_NAMES}
    return BUILTIN_DENIED_ENV_NAMES | extra


def is_denied_env_name(name: str) -> bool:
    """On the deny-list, or matching a built-in pattern or a pattern in
    ``LLM_ROUTING["DENIED_KEY_ENV_NAMES"]`` (entries may use ``*`` / ``?``)."""
    names = denied_env_names()
    if name in names:
        return True
    patterns = [*BUILTIN_DENIED_ENV_PATTERNS, *(n for n in names if "*" in n or "?" in n)]
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def validate_api_key_env(value: str) -> None:
    """An upper-case environment variable NAME, not on the deny-list, never a key."""
    if not value:
        return
    if not ENV_NAME_RE.fullmatch(value):
        raise ValidationError(
            "Enter the NAME of an environment variable (A-Z, 0-9, _; not starting with a "
            "digit; at most 128 characters), not the key itself.",
            code="invalid_env_name",
        )
    if is_denied_env_name(value):
        raise ValidationError(
            "%(name)s holds a deployment secret and may not be used as a provider key.",
            code="denied_env_name",
            params={"name": value},
        )


@deconstructible
class HttpUrlValidator(URLValidator):
    """http(s) only; no credentials in the URL."""

    def __init__(self) -> None:
        super().__init__(schemes=["http", "https"])

    def __call__(self, value: str) -> None:
        super().__call__(value)
        authority = value.split("://", 1)[1].split("/", 1)[0]
        if "@" in authority:
            raise ValidationError(
                "Credentials may not be embedded in base_url; use api_key_env.",
                code="credentials_in_url",
            )


validate_base_url = HttpUrlValidator()
