"""The exception reporter filter of the demo project: no credentials on the DEBUG 500 page.

Django's default filter hides settings whose *name* looks secret (``KEY``, ``PASS``,
``TOKEN`` …) but prints ``CELERY_BROKER_URL``, ``CACHES["default"]["LOCATION"]``,
``DATABASE_URL`` in ``request.META`` and the like with their passwords. This filter also
masks the password of any URL-shaped value (``scheme://user:password@host``) wherever it
appears, and hides ``*DSN*`` settings (a Sentry DSN's user part is its key) outright.
"""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

__all__ = ["CredentialSafeReporterFilter", "mask_url_password"]

_URL_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:)[^\s@/]+(?=@)")


def mask_url_password(text: str) -> str:
    """``amqp://user:pw@host`` → ``amqp://user:********@host`` (every URL in *text*)."""
    return _URL_PASSWORD_RE.sub(r"\g<head>********", text)


class CredentialSafeReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|DSN", flags=re.IGNORECASE
    )

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):
            return mask_url_password(cleansed)
        return cleansed
