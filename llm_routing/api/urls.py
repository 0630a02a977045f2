from __future__ import annotations

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from .docs_views import SwaggerAssetView, SwaggerDocsView
from .embeddings_face import EmbeddingsView
from .explain_views import ExplainView
from .job_views import AuditJobView
from .messages_face import CountTokensView, MessagesView
from .metrics_views import metrics_view
from .openai_compat import ChatCompletionsView, ModelsView
from .responses_face import ResponsesView
from .views import AuditView, HealthView

app_name = "llm_routing"

urlpatterns = [
    path("audit/", AuditView.as_view(), name="audit"),
    path("audit/explain/", ExplainView.as_view(), name="audit-explain"),
    path("audit/jobs/<str:job_id>/", AuditJobView.as_view(), name="audit-job"),
    path("health/", HealthView.as_view(), name="health"),
    path("v1/chat/completions", ChatCompletionsView.as_view(), name="chat-completions"),
    path("v1/models", ModelsView.as_view(), name="models"),
    path("v1/embeddings", EmbeddingsView.as_view(), name="embeddings"),
    path("v1/responses", ResponsesView.as_view(), name="responses"),
    path("v1/messages", MessagesView.as_view(), name="messages"),
    path("v1/messages/count_tokens", CountTokensView.as_view(), name="messages-count-tokens"),
    path("metrics", metrics_view, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SwaggerDocsView.as_view(), name="docs"),
    path("api/docs/assets/<str:filename>", SwaggerAssetView.as_view(), name="docs-asset"),
]
