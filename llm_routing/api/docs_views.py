"""``/api/docs/``: the Swagger UI with assets served by the app itself (no CDN).

The assets come from the ``drf-spectacular-sidecar`` package (a dependency of the app)
and are streamed by :class:`SwaggerAssetView` from the package directory, so the page
works offline in any host project: no ``INSTALLED_APPS`` entry, no ``collectstatic``,
no ``SPECTACULAR_SETTINGS`` needed, whatever ``DEBUG`` says.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from django.http import FileResponse, Http404, HttpRequest
from django.urls import reverse
from django.utils.cache import patch_cache_control
from django.views import View
from drf_spectacular.views import SpectacularSwaggerView

__all__ = ["SWAGGER_ASSETS", "SwaggerAssetView", "SwaggerDocsView", "swagger_dist_dir"]

#: The only files served: what the Swagger UI page loads.
SWAGGER_ASSETS = frozenset(
    {
        "swagger-ui.css",
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
        "favicon-32x32.png",
    }
)


def swagger_dist_dir() -> Path:
    import drf_spectacular_sidecar

    return (
        Path(drf_spectacular_sidecar.__file__).parent
        / "static"
        / ("drf_spectacular_sidecar/swagger-ui-dist")
    )


def _asset_url(filename: str) -> str:
    return reverse("llm_routing:docs-asset", args=[filename])


class SwaggerDocsView(SpectacularSwaggerView):
    """drf-spectacular's Swagger UI page, pointed at the app's own asset URLs."""

    url_name = "llm_routing:schema"

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return _asset_url(filename)

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return _asset_url("favicon-32x32.png")


class SwaggerAssetView(View):
    """One Swagger UI file from the sidecar package; anything else is a 404."""

    def get(self, request: HttpRequest, filename: str) -> FileResponse:
        if filename not in SWAGGER_ASSETS:
            raise Http404("No such asset.")
        path = swagger_dist_dir() / filename
        if not path.is_file():
            raise Http404("No such asset.")
        content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
        response = FileResponse(path.open("rb"), content_type=content_type)
        patch_cache_control(response, public=True, max_age=86_400)
        return response
