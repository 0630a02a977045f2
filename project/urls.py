from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("admin/", admin.site.urls),
    path("", include("llm_routing.urls")),
]

admin.site.site_header = "django-llm-routing"
admin.site.site_title = "LLM routing admin"
admin.site.index_title = "Providers, chains, rules and routing logs"
