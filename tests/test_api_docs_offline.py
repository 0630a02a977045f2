"""``/api/docs/`` renders with no internet in any host: every asset the page loads is
served by the app itself, even when the host neither lists ``drf_spectacular_sidecar``
in ``INSTALLED_APPS`` nor sets ``SPECTACULAR_SETTINGS`` (drf-spectacular's defaults
point at a CDN)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import override_settings
from drf_spectacular.settings import spectacular_settings

pytestmark = pytest.mark.django_db

CDN = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@latest"


@pytest.fixture
def bare_host(monkeypatch):
    """A host that followed the quickstart: drf-spectacular's own defaults."""
    monkeypatch.setattr(spectacular_settings, "SWAGGER_UI_DIST", CDN)
    monkeypatch.setattr(spectacular_settings, "SWAGGER_UI_FAVICON_HREF", CDN + "/favicon-32x32.png")
    apps = [a for a in settings.INSTALLED_APPS if a != "drf_spectacular_sidecar"]
    with override_settings(INSTALLED_APPS=apps):
        yield


def test_docs_page_loads_only_same_origin_assets(anon, bare_host):
    page = anon.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs, html
    assert not [r for r in refs if "//" in r], refs
    for ref in refs:
        asset = anon.get(ref)
        assert asset.status_code == 200, ref
        body = b"".join(asset.streaming_content)
        assert len(body) > 500, ref
    assert any(r.endswith("swagger-ui-bundle.js") for r in refs)


def test_only_the_swagger_files_are_served(anon):
    assert anon.get("/api/docs/assets/swagger-ui.css").status_code == 200
    assert anon.get("/api/docs/assets/LICENSE").status_code == 404
    assert anon.get("/api/docs/assets/..%2F..%2Fsettings.py").status_code == 404
