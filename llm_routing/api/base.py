"""The base of every API view: authentication, permissions and throttles from
``LLM_ROUTING``, the size-limited JSON parser, and the access check that carries the
caller's identity into the router's request, then the caller's budgets (429)."""

from __future__ import annotations

from dataclasses import replace

from django.utils.module_loading import import_string
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from ..access import principal_for, refusal
from ..conf import routing_settings
from ..types import AuditRequest
from .budget_guard import enforce_budgets
from .parsers import LimitedJSONParser

__all__ = ["RoutingAPIView"]


class RoutingAPIView(APIView):
    # Authentication, permissions and throttles come from ``LLM_ROUTING`` (read per
    # request, so ``override_settings`` applies). A comment, not a docstring: the
    # OpenAPI page would show a docstring as every endpoint's description.

    parser_classes = [LimitedJSONParser]

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [import_string(p)() for p in routing_settings.API_AUTHENTICATION_CLASSES]

    def get_permissions(self) -> list[BasePermission]:
        return [import_string(p)() for p in routing_settings.API_PERMISSION_CLASSES]

    def get_throttles(self) -> list[BaseThrottle]:
        return [import_string(p)() for p in routing_settings.API_THROTTLE_CLASSES]

    def authorize(self, request: Request, audit_request: AuditRequest) -> AuditRequest:
        """The request carrying its caller's identity; 403 with the reason when the
        caller may not route where it asks (docs/operations.md)."""
        audit_request = replace(audit_request, principal=principal_for(request.user))
        reason = refusal(audit_request)
        if reason is not None:
            raise PermissionDenied(reason)
        enforce_budgets(request, audit_request.principal)  # budgets: 429 before the walk
        return audit_request
