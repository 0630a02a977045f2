"""Providers, chains, routing rules (configuration) and decisions/attempts (logs).

Configuration rows are edited in the admin; log rows are written only by
:mod:`llm_routing.recorder` and are read-only everywhere else. No row ever holds a key
or the raw input: a Provider stores the NAME of the environment variable, a
RoutingDecision stores the input's length and SHA-256.
"""

from __future__ import annotations

import fnmatch
import os
import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .signals import config_changed
from .strategies import STRATEGIES
from .types import MOCK_PROVIDER_NAME, ProviderConfig
from .validators import validate_api_key_env, validate_base_url

__all__ = [
    "STRATEGIES",
    "Attempt",
    "AuditJob",
    "Budget",
    "Chain",
    "ChainEntry",
    "Provider",
    "RoutingDecision",
    "RoutingRule",
    "group_steps",
    "rule_matches",
]

_M = TypeVar("_M", bound=models.Model)


class ConfigQuerySet(models.QuerySet[_M]):
    """The configuration models' queryset: its bulk writes, which send no
    ``post_save``, send ``config_changed`` (the config snapshot is rebuilt)."""

    def update(self, **kwargs: Any) -> int:
        count = super().update(**kwargs)
        config_changed.send(sender=self.model, using=self.db)
        return count

    def bulk_create(self, objs: Iterable[_M], *args: Any, **kwargs: Any) -> list[_M]:
        created = super().bulk_create(objs, *args, **kwargs)
        config_changed.send(sender=self.model, using=self.db)
        return created

    def bulk_update(self, objs: Iterable[_M], fields: Any, *args: Any, **kwargs: Any) -> int:
        count = super().bulk_update(objs, fields, *args, **kwargs)
        config_changed.send(sender=self.model, using=self.db)
        return count


def rule_matches(rule_route: str, task_glob: str, *, task: str, route: str | None) -> bool:
    """Whether a rule keyed on ``rule_route`` / ``task_glob`` matches a request (both
    conditions that are set must hold; a rule with neither matches nothing)."""
    if rule_route and rule_route != (route or ""):
        return False
    if task_glob and not fnmatch.fnmatchcase(task, task_glob):
        return False
    return bool(rule_route or task_glob)


STRATEGY_CHOICES = [("", "(a step of one)")] + [(s, s) for s in STRATEGIES]


class _Stepped(Protocol):
    @property
    def step(self) -> int | None: ...


_E = TypeVar("_E", bound=_Stepped)


def group_steps(entries: Iterable[_E]) -> list[list[_E]]:
    """A chain's entries (in position order) grouped into steps: entries sharing a step
    number form one step, placed where its first entry is; an entry without a step
    number is a step of its own. Used by the snapshot, the admin and the config file."""
    steps: list[list[_E]] = []
    by_number: dict[int, list[_E]] = {}
    for entry in entries:
        number = entry.step
        if number is None:
            steps.append([entry])
        elif number in by_number:
            by_number[number].append(entry)
        else:
            by_number[number] = [entry]
            steps.append(by_number[number])
    return steps


_INHERIT_HELP = "Unknown: inherit what the adapter kind declares; Yes/No: override it."


class Provider(models.Model):
    class Mode(models.TextChoices):
        LIVE = "live", "live"
        MOCK = "mock", "mock (answers offline)"

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(
        max_length=64,
        help_text="Adapter key: openai, openai_compatible, anthropic, gemini, mock, "
        "or a kind registered in LLM_ROUTING['PROVIDER_KINDS'].",
    )
    model = models.CharField(max_length=128, blank=True)
    base_url = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_base_url],
        help_text="Optional http(s) endpoint; empty means the vendor default.",
    )
    api_key_env = models.CharField(
        "API key variable",
        max_length=128,
        blank=True,
        validators=[validate_api_key_env],
        help_text="NAME of the environment variable that holds the key (never the key).",
    )
    enabled = models.BooleanField(default=True)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.LIVE)
    timeout_s = models.FloatField(default=30.0)
    first_token_timeout_s = models.FloatField(default=10.0)
    max_retries = models.PositiveSmallIntegerField(default=2)
    params = models.JSONField(
        default=dict, blank=True, help_text="Extra request parameters: temperature, max_tokens …"
    )
    # Capabilities: None (the default) inherits what the adapter kind declares;
    # True/False overrides it for this row (see BaseProvider.supports).
    supports_structured_output = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    supports_streaming = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    supports_prefill = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    supports_tools = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    supports_images = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    supports_embeddings = models.BooleanField(
        null=True, blank=True, default=None, help_text=_INHERIT_HELP
    )
    embedding_dimensions = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=None,
        validators=[MinValueValidator(1), MaxValueValidator(65_536)],
        help_text="The length of the vectors this row answers on /v1/embeddings. "
        "Failover only moves between rows of the same dimension; empty: not declared.",
    )
    # A price override (USD per million tokens) for self-hosted or negotiated prices;
    # both empty: the genai-prices package's price (docs/observability.md).
    input_price_per_mtok = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        default=None,
        help_text="USD per million input tokens; overrides the price package. "
        "Set both prices or neither.",
    )
    output_price_per_mtok = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        default=None,
        help_text="USD per million output tokens; overrides the price package. "
        "Set both prices or neither.",
    )
    # The model's context window in tokens, when declared: after a context_length
    # failure, candidates whose window is not larger are skipped (context_too_small).
    context_window = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=None,
        help_text="Context window in tokens (optional). After a context-length failure, "
        "candidates whose window is not larger are skipped.",
    )
    # How long a conversation's affinity key keeps it on this provider: the lifetime of
    # the provider's prompt cache (docs/strategies.md, "Prompt-cache affinity").
    affinity_ttl_s = models.PositiveIntegerField(
        "affinity TTL (s)",
        default=300,
        validators=[MinValueValidator(1), MaxValueValidator(86400)],
        help_text="How long requests with the same affinity key keep coming back here: "
        "the life of the provider's prompt cache (300; 3600 for a one-hour cache).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ConfigQuerySet["Provider"].as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(timeout_s__gt=0) & Q(first_token_timeout_s__gt=0),
                name="llm_routing_provider_timeouts_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_retries__lte=10), name="llm_routing_provider_max_retries_lte_10"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_mode(self) -> str:
        """``mock`` when this row answers offline: kind ``mock``, mode ``mock``, or the
        reserved backstop name (always the mock adapter). Such a row has no upstream and
        no circuit; the admin and ``llm_routing_check`` show this value."""
        if self.kind == "mock" or self.mode == self.Mode.MOCK or self.name == MOCK_PROVIDER_NAME:
            return self.Mode.MOCK.value
        return self.Mode.LIVE.value

    @property
    def key_present(self) -> bool:
        """Whether the key variable is set and non-empty. The value is never kept."""
        return bool(self.api_key_env) and bool(os.environ.get(self.api_key_env))

    def clean(self) -> None:
        from .providers.registry import is_known_kind

        errors: dict[str, Any] = {}
        if self.kind and not is_known_kind(self.kind):
            errors["kind"] = ValidationError(
                "Unknown provider kind %(kind)s.", code="unknown_kind", params={"kind": self.kind}
            )
        if not isinstance(self.params, dict):
            errors["params"] = ValidationError("params must be a JSON object.", code="invalid")
        if (self.input_price_per_mtok is None) != (self.output_price_per_mtok is None):
            errors[
                "output_price_per_mtok"
                if self.output_price_per_mtok is None
                else "input_price_per_mtok"
            ] = ValidationError(
                "Set both prices per million tokens, or neither.", code="price_pair"
            )
        if errors:
            raise ValidationError(errors)

    def to_config(self) -> ProviderConfig:
        return ProviderConfig(
            name=self.name,
            kind=self.kind,
            model=self.model,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            enabled=self.enabled,
            mode=self.mode,
            timeout_s=self.timeout_s,
            first_token_timeout_s=self.first_token_timeout_s,
            max_retries=self.max_retries,
            params=dict(self.params or {}),
            supports_structured_output=self.supports_structured_output,
            supports_streaming=self.supports_streaming,
            supports_prefill=self.supports_prefill,
            supports_tools=self.supports_tools,
            supports_images=self.supports_images,
            supports_embeddings=self.supports_embeddings,
            embedding_dimensions=self.embedding_dimensions,
            version=self.updated_at.isoformat() if self.updated_at else "",
        )


def validate_hedge_after(value: str) -> None:
    """A chain's ``hedge_after_ms``: empty, ``p95`` or a whole number of milliseconds
    from 1 to 600000."""
    if value in {"", "p95"}:
        return
    if not value.isdigit() or not 1 <= int(value) <= 600_000:
        raise ValidationError(
            "Enter a whole number of milliseconds (1 to 600000), 'p95', or leave it empty."
        )


class HedgeAfterField(models.CharField):
    """Stored as text ("", "400", "p95"); the config file writes a number as a number
    (:mod:`llm_routing.config_io`)."""


class Chain(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    is_default = models.BooleanField(
        default=False, help_text="Used when no routing rule matches. At most one chain."
    )
    stream_mode = models.CharField(
        max_length=16,
        choices=[
            ("direct", "direct: fail over only before the first chunk"),
            ("atomic", "atomic: buffer the whole answer, then stream it"),
            ("continuation", "continuation: a prefill-capable fallback continues the text"),
        ],
        default="direct",
        help_text="What happens when a stream fails after text was delivered.",
    )
    mock_backstop = models.BooleanField(
        default=False,
        help_text="Let the built-in mock answer on /v1 when every real candidate was "
        "skipped or failed (POST /audit/ always falls back to the mock).",
    )
    affinity_from_user = models.BooleanField(
        default=False,
        help_text="Use the OpenAI 'user' field as the affinity key when a request carries "
        "none (X-LLM-Affinity, 'affinity'): a user's requests return to the candidate "
        "that served them last, where the prompt cache is warm.",
    )
    hedge_after_ms = HedgeAfterField(
        max_length=8,
        blank=True,
        default="",
        validators=[validate_hedge_after],
        help_text="Hedged requests: when the first attempt has not answered after this many "
        "milliseconds (a number), or after the primary's recent 95th-percentile latency "
        "('p95'), the next candidate starts too and the first answer wins. Empty: no "
        "hedging.",
    )
    # Who may use the chain (docs/operations.md "Who may route where"): both empty →
    # everyone; otherwise only these users and the members of these groups.
    allowed_users = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="llm_routing_chains",
        help_text="Users who may use this chain. Empty here and below: everyone.",
    )
    allowed_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="llm_routing_chains",
        help_text="Groups whose members may use this chain.",
    )

    objects = ConfigQuerySet["Chain"].as_manager()

    class Meta:
        ordering = ["name"]
        permissions = [
            ("force_provider", "Can force one provider (force_provider)"),
            ("route_any_provider", "Can name a provider outside the chains they may use"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=Q(is_default=True),
                name="llm_routing_chain_single_default",
                violation_error_message="Another chain is already the default chain.",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def provider_names(self) -> list[tuple[str, str]]:
        """(provider name, model override) of the enabled entries, in position order."""
        return [
            (e.provider.name, e.model)
            for e in self.entries.select_related("provider").order_by("position")
            if e.enabled
        ]


class ChainEntry(models.Model):
    chain = models.ForeignKey(Chain, on_delete=models.CASCADE, related_name="entries")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="entries")
    position = models.PositiveIntegerField(default=0)
    model = models.CharField(
        max_length=128, blank=True, help_text="Optional model override for this chain."
    )
    enabled = models.BooleanField(default=True)
    # Steps (docs/strategies.md): entries sharing a step number form one step, tried in
    # the step's strategy order; an entry without one is a step by itself.
    step = models.PositiveIntegerField(
        null=True,
        blank=True,
        default=None,
        help_text="Entries with the same step number form one step (a set of candidates "
        "picked by the strategy); empty: a step of its own.",
    )
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="Share of the step's traffic (weighted) and tie-break (cost); 0 drains it.",
    )
    strategy = models.CharField(
        max_length=16,
        blank=True,
        choices=STRATEGY_CHOICES,
        help_text="How the step picks among its entries (set on every entry of the step).",
    )

    objects = ConfigQuerySet["ChainEntry"].as_manager()

    class Meta:
        ordering = ["chain", "position"]
        verbose_name_plural = "chain entries"
        constraints = [
            models.UniqueConstraint(
                fields=["chain", "position"], name="llm_routing_chainentry_unique_position"
            ),
            models.UniqueConstraint(
                fields=["chain", "provider"], name="llm_routing_chainentry_unique_provider"
            ),
            models.CheckConstraint(
                condition=Q(weight__gte=0), name="llm_routing_chainentry_weight_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.chain.name}: {self.provider.name} at position {self.position}"


class RoutingRule(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    priority = models.IntegerField(default=100, help_text="Lower numbers are tried first.")
    enabled = models.BooleanField(default=True)
    route = models.CharField(
        max_length=64, blank=True, help_text="Matches requests whose route key equals this."
    )
    task_glob = models.CharField(
        max_length=128, blank=True, help_text="Shell-style pattern on the task, e.g. summarize*."
    )
    chain = models.ForeignKey(Chain, on_delete=models.PROTECT, related_name="rules")

    objects = ConfigQuerySet["RoutingRule"].as_manager()

    class Meta:
        ordering = ["priority", "name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not self.route and not self.task_glob:
            raise ValidationError(
                "A rule needs a route key, a task pattern, or both.", code="no_condition"
            )

    def matches(self, *, task: str, route: str | None) -> bool:
        return rule_matches(self.route, self.task_glob, task=task, route=route)


class RoutingDecision(models.Model):
    request_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    task = models.CharField(max_length=64)
    route = models.CharField(max_length=64, blank=True)
    rule = models.CharField(max_length=64, blank=True)
    router_mode = models.CharField(max_length=16)
    chain_name = models.CharField(max_length=64, blank=True)
    requested_provider = models.CharField(max_length=64, blank=True)
    selected_provider = models.CharField(max_length=64, blank=True)
    fallback_used = models.BooleanField(default=False)
    fallback_reason = models.CharField(max_length=32, blank=True)
    status = models.CharField(max_length=16)
    mode = models.CharField(max_length=16)
    input_length = models.PositiveIntegerField()
    input_sha256 = models.CharField(max_length=64)
    total_latency_ms = models.FloatField(default=0.0)
    # USD, the sum of its attempts' costs; null when any attempted price is unknown.
    cost_usd = models.DecimalField(max_digits=18, decimal_places=10, null=True, blank=True)
    # The caller's user pk (as text; blank: anonymous or the Python API), for the
    # dashboard's per-user figures. Not a foreign key: logs outlive deleted users.
    user_pk = models.CharField(max_length=64, blank=True, default="", editable=False)
    # How the request's hedge went (``routing_metadata.hedge``): won, lost, failed,
    # skipped; blank when no hedge was due. The Attempt rows alone cannot tell a hedge
    # that answered after the primary failed from a failover, nor a hedge that failed.
    hedge = models.CharField(max_length=8, blank=True, default="", editable=False)
    # When the decision was made, set by the recorder (a write-behind batch or the spool's
    # replay writes it later); not auto_now_add, which would overwrite it with the write
    # time.
    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        get_latest_by = "created_at"
        indexes = [
            # The admin dashboard's window counts (requests, fallbacks), index-only.
            models.Index(fields=["created_at", "fallback_used"], name="llmr_decision_window"),
            # The dashboard's spend per provider / user over a window, index-only.
            models.Index(
                fields=["created_at", "user_pk", "selected_provider"], name="llmr_decision_spend"
            ),
            # The dashboard's hedges per chain over a window (with the chain's requests,
            # for the hedge rate), index-only.
            models.Index(fields=["created_at", "chain_name", "hedge"], name="llmr_decision_hedge"),
        ]

    def __str__(self) -> str:
        return str(self.request_id)


class Attempt(models.Model):
    class Outcome(models.TextChoices):
        OK = "ok", "ok"
        ERROR = "error", "error"
        SKIPPED = "skipped", "skipped"
        HEDGE_LOST = "hedge_lost", "hedge lost"  # cancelled: the other side answered first
        HEDGE_SKIPPED = "hedge_skipped", "hedge skipped"  # a hedge was due, not affordable

    decision = models.ForeignKey(RoutingDecision, on_delete=models.CASCADE, related_name="attempts")
    index = models.PositiveSmallIntegerField()
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=128, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=32, blank=True)
    error_category = models.CharField(max_length=32, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    transient = models.BooleanField(default=False)
    retries = models.PositiveSmallIntegerField(default=0)
    latency_ms = models.FloatField(default=0.0)
    # USD for the tokens this attempt consumed (failed ones too); null: price unknown.
    cost_usd = models.DecimalField(max_digits=18, decimal_places=10, null=True, blank=True)
    served = models.BooleanField(default=False)
    partial = models.BooleanField(default=False)
    # The chain step the candidate belonged to (0 first); null for a forced call.
    step = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["decision", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["decision", "index"], name="llm_routing_attempt_unique_index"
            )
        ]
        indexes = [
            # The admin dashboard: a decision-id range, grouped by provider and outcome,
            # with the latency for percentiles — all read from the index.
            models.Index(
                fields=["decision", "provider", "outcome", "latency_ms"],
                name="llmr_attempt_dashboard",
            ),
            models.Index(
                fields=["decision", "reason"],
                condition=Q(outcome="skipped"),
                name="llmr_attempt_skips",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.decision_id}#{self.index} {self.provider} {self.outcome}"


class AuditJob(models.Model):
    """One asynchronous ``POST /audit/`` (``"async": true``), run by a Celery worker.

    ``payload`` holds the validated request only while the job is unfinished and is
    nulled when it finishes; ``result`` holds the same envelope the synchronous path
    answers. The routing decision of a job reuses the job's id as its ``request_id``,
    so a job can never be logged twice. State changes go through :mod:`llm_routing.jobs`.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="llm_routing_jobs"
    )
    status = models.CharField(
        max_length=8, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    task = models.CharField(max_length=64)
    payload = models.JSONField(null=True, blank=True, editable=False)
    result = models.JSONField(null=True, blank=True, editable=False)
    error = models.JSONField(null=True, blank=True, editable=False)
    request_id = models.UUIDField(null=True, blank=True, editable=False)
    claims = models.PositiveSmallIntegerField(default=0, editable=False)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        get_latest_by = "created_at"

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status in {self.Status.DONE, self.Status.FAILED}


class Budget(models.Model):
    """A hard cap on requests, tokens and/or cost per window for a user, a group, an API
    token or everyone (docs/budgets.md). Counters live in the cache, enforced by
    :mod:`llm_routing.budgets`; this row is only the declaration."""

    class Scope(models.TextChoices):
        USER = "user", "user"
        GROUP = "group", "group"
        TOKEN = "token", "API token"
        GLOBAL = "global", "global"

    class Window(models.TextChoices):
        MINUTE = "minute", "minute"
        HOUR = "hour", "hour"
        DAY = "day", "day (UTC)"
        MONTH = "month", "month (UTC)"

    class OnCacheDown(models.TextChoices):
        OPEN = "open", "open (allow and log)"
        CLOSED = "closed", "closed (refuse with 503)"

    name = models.SlugField(max_length=64, unique=True)
    scope = models.CharField(max_length=8, choices=Scope.choices)
    subject = models.CharField(
        max_length=150,
        blank=True,
        help_text="The username, group name or API token key; empty for a global budget.",
    )
    window = models.CharField(max_length=8, choices=Window.choices, default=Window.DAY)
    max_requests = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Input plus output tokens of the answered requests."
    )
    max_cost_usd = models.DecimalField(
        "max cost (USD)",
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
    )
    soft_threshold = models.FloatField(
        default=0.8,
        validators=[MinValueValidator(0.01), MaxValueValidator(1.0)],
        help_text="Fraction of a cap at which budget_threshold_reached fires (once per window).",
    )
    on_cache_down = models.CharField(
        max_length=8, choices=OnCacheDown.choices, default=OnCacheDown.OPEN
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_requests__isnull=False)
                | Q(max_tokens__isnull=False)
                | Q(max_cost_usd__isnull=False),
                name="llm_routing_budget_has_a_cap",
                violation_error_message="Set at least one of max_requests, max_tokens, "
                "max_cost_usd.",
            ),
            models.CheckConstraint(
                condition=(Q(scope="global") & Q(subject=""))
                | (~Q(scope="global") & ~Q(subject="")),
                name="llm_routing_budget_subject_by_scope",
                violation_error_message="A global budget has no subject; the others need one.",
            ),
            models.CheckConstraint(
                condition=Q(soft_threshold__gt=0) & Q(soft_threshold__lte=1),
                name="llm_routing_budget_soft_threshold_fraction",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        if self.max_requests is None and self.max_tokens is None and self.max_cost_usd is None:
            raise ValidationError(
                {"max_requests": "Set at least one of max_requests, max_tokens, max_cost_usd."}
            )
        if self.scope == self.Scope.GLOBAL and self.subject:
            raise ValidationError({"subject": "A global budget has no subject."})
        if self.scope and self.scope != self.Scope.GLOBAL and not self.subject:
            raise ValidationError(
                {"subject": "Required: the username, group name or API token key."}
            )
