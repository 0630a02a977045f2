"""Configuration as code: providers, chains and rules in a TOML file.

``manage.py llm_routing_apply routing.toml`` and ``manage.py llm_routing_export`` are
thin wrappers over :func:`apply` and :func:`export`. The format (docs/configuration.md)::

    version = 1

    [providers.openai-main]
    kind = "openai"
    model = "gpt-4o-mini"
    api_key_env = "OPENAI_API_KEY"     # the variable's NAME, never the key

    [chains.default]
    is_default = true
    entries = ["openai-main", { provider = "anthropic", model = "claude-haiku-4-5" }]

    [chains.spread]                    # steps: docs/strategies.md
    entries = [
        { any = ["oa-key1", { provider = "oa-key2", weight = 0.25 }], strategy = "weighted" },
        "anthropic",
    ]

    [rules.cheap]
    priority = 10
    route = "cheap"
    chain = "default"

    [[budgets]]                        # docs/budgets.md
    name = "alice-daily"
    scope = "user"
    subject = "alice"
    window = "day"
    max_requests = 50

Why TOML: the parser is in the standard library (``tomllib``), the format has comments,
real types and no implicit conversions (YAML's ``no`` → ``False``), and ``tomli-w``
writes it back. Fields are derived from the models, so a field added to Provider,
Chain, ChainEntry or RoutingRule is carried by the file without touching this module.

Guarantees:

* **Validate everything, then write everything**: the file is parsed, checked by the
  input boundary (:mod:`llm_routing.boundary`: no NaN or infinity, no NUL, nesting
  within ``MAX_JSON_DEPTH``; errors name the field), type-checked,
  scanned for key values and every row is ``full_clean``-ed before the first write;
  the writes happen in one transaction.
* **Idempotent**: applying the same file twice changes nothing the second time; the
  plan lists every change (``+`` create, ``~`` update, ``-`` delete).
* **No keys**: a field named like a credential (``api_key``, ``token`` …) anywhere, or a
  string that looks like a key (``sk-…``, ``AIza…`` …), refuses the whole file. Error
  messages name the place, never the value.
* **Canonical export**: :func:`export` sorts providers and chains by name, rules by
  (priority, name), writes model-field order, omits values equal to the field default,
  and sorts ``params`` keys — so apply → export → apply is a no-op and export → apply
  → export is byte-for-byte identical.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import islice
from typing import Any

import tomli_w
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction

from .boundary import problems
from .conf import routing_settings
from .models import Budget, Chain, ChainEntry, HedgeAfterField, Provider, RoutingRule, group_steps
from .strategies import STRATEGIES

__all__ = [
    "FORMAT_VERSION",
    "Change",
    "ConfigError",
    "DesiredState",
    "apply",
    "export",
    "loads",
    "parse",
]

FORMAT_VERSION = 1
HEADER = (
    "# django-llm-routing configuration (format version 1), written by llm_routing_export.\n"
    "# Keys never appear here: api_key_env names the environment variable that holds one.\n\n"
)

# Field names that would carry a credential; compared after lower-casing and "-" → "_".
CREDENTIAL_FIELD_NAMES = frozenset(
    {
        "api_key",
        "apikey",
        "key",
        "secret",
        "secret_key",
        "client_secret",
        "token",
        "access_token",
        "auth_token",
        "bearer",
        "password",
        "authorization",
        "credentials",
        "x_api_key",
        "x_goog_api_key",
    }
)
# Shapes of vendor keys and bearer tokens. Searched in every string of the file.
KEY_VALUE_PATTERNS = (
    re.compile(r"sk-(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{16,}"),  # OpenAI, Anthropic
    re.compile(r"AIza[0-9A-Za-z_\-]{30,}"),  # Google
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\b(?:gh[pousr]|hf|gsk|xai|pplx|glpat)[_-][A-Za-z0-9_\-]{20,}"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{16,}"),
)

_SKIPPED_FIELDS = frozenset({"id", "name", "created_at", "updated_at", "position"})
_SECTIONS = ("providers", "chains", "rules")
# A chain entry's fields the file's structure carries (a step of several), not its table.
_STRUCTURAL = frozenset({"step", "strategy"})


class ConfigError(Exception):
    """The file is not a valid configuration; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class Change:
    """One row-level change of a plan: ``+`` create, ``~`` update, ``-`` delete."""

    action: str
    kind: str  # provider | chain | rule
    name: str
    details: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.action} {self.kind} {self.name}"
        if self.details:
            text += ": " + "; ".join(self.details)
        return text


@dataclass
class DesiredState:
    """The file's content, normalized: every field present, in canonical types."""

    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    chains: dict[str, dict[str, Any]] = field(default_factory=dict)  # incl. "entries"
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)  # [[budgets]] by name


# --- fields -----------------------------------------------------------------------


def _scalar_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """Editable, non-relational, non-bookkeeping fields, in model order."""
    return [
        f
        for f in model._meta.concrete_fields
        if f.editable and not f.primary_key and not f.is_relation and f.name not in _SKIPPED_FIELDS
    ]


def _default(f: models.Field[Any, Any]) -> Any:
    return f.get_default()  # "" for text fields without a default, {} for params


def _coerce(f: models.Field[Any, Any], value: Any, path: str, errors: list[str]) -> Any:
    """Check a TOML value against a model field's Python type."""
    if isinstance(f, HedgeAfterField):  # a number of milliseconds or "p95"
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return str(value)
        if value == "p95":
            return value
        errors.append(f'{path}: expected a whole number of milliseconds or "p95".')
        return None
    if isinstance(f, models.BooleanField):
        if isinstance(value, bool):
            return value
        errors.append(f"{path}: expected true or false.")
    elif isinstance(f, models.FloatField | models.DecimalField):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        errors.append(f"{path}: expected a number.")
    elif isinstance(f, models.IntegerField):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        errors.append(f"{path}: expected an integer.")
    elif isinstance(f, models.JSONField):
        if isinstance(value, dict):
            return _sorted(value)
        errors.append(f"{path}: expected a table.")
    elif isinstance(f, models.DecimalField):
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return Decimal(str(value))
        errors.append(f"{path}: expected a number, at least 0.")
    elif isinstance(f, models.CharField | models.TextField):
        if isinstance(value, str):
            return value
        errors.append(f"{path}: expected a string.")
    else:
        return value
    return None


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def _row_values(obj: models.Model) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in _scalar_fields(type(obj)):
        value = getattr(obj, f.attname)
        if isinstance(f, models.JSONField):
            value = _sorted(value if value is not None else {})
        elif isinstance(f, models.FloatField | models.DecimalField) and value is not None:
            value = float(value)
        out[f.name] = value
    return out


# --- parsing ------------------------------------------------------------------------


def loads(text: str) -> DesiredState:
    """Parse and validate the file's text (no database access)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"Not valid TOML: {exc}"]) from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        limit = int(routing_settings.MAX_JSON_DEPTH)
        raise ConfigError([f"Not accepted: values nested deeper than {limit} levels."]) from None
    return parse(data)


def _walk_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield path + "." + str(k), str(k)
            yield from _walk_strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_strings(v, f"{path}[{i}]")


def _walk_keys(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield f"{path}.{k}" if path else str(k), str(k)
            yield from _walk_keys(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_keys(v, f"{path}[{i}]")


def _named_tables(data: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The content of every [section.NAME] table (names themselves are not fields)."""
    for section in _SECTIONS:
        tables = data.get(section)
        if isinstance(tables, Mapping):
            for name, table in tables.items():
                yield f"{section}.{name}", table


def _credential_errors(data: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    field_keys = [
        (f"{path}.{sub}", key)
        for path, table in _named_tables(data)
        for sub, key in _walk_keys(table, "")
    ]
    top_keys = [(str(k), str(k)) for k in data if k not in _SECTIONS]
    for path, key in top_keys + field_keys:
        if key.lower().replace("-", "_") in CREDENTIAL_FIELD_NAMES:
            errors.append(
                f"{path}: key values may not appear in the file; set api_key_env to the "
                "NAME of the environment variable that holds the key."
            )
    for path, text in _walk_strings(data, ""):
        if any(p.search(text) for p in KEY_VALUE_PATTERNS):
            errors.append(
                f"{path.lstrip('.')}: this looks like a key value (not shown); the file may "
                "hold only environment variable NAMES."
            )
    return errors


def _fields_from(
    model: type[models.Model],
    table: Mapping[str, Any],
    path: str,
    errors: list[str],
    *,
    extra: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    fields = {f.name: f for f in _scalar_fields(model)}
    unknown = sorted(set(table) - set(fields) - extra)
    if unknown:
        errors.append(
            f"{path}: unknown field(s) {', '.join(unknown)}; "
            f"expected {', '.join([*fields, *sorted(extra)])}."
        )
    out: dict[str, Any] = {}
    for name, f in fields.items():
        if name in table:
            out[name] = _coerce(f, table[name], f"{path}.{name}", errors)
        else:
            out[name] = _default(f)
    return out


def _slug_ok(name: str) -> bool:
    return bool(re.fullmatch(r"[-a-zA-Z0-9_]{1,64}", name))


def parse(data: Mapping[str, Any]) -> DesiredState:
    """Validate the structure and types of parsed TOML (no database access)."""
    # The input boundary first (llm_routing.boundary, as for API requests): no NaN or
    # infinity, no NUL, integers within 64 bits, nesting within MAX_JSON_DEPTH — before
    # the recursive checks below ever see the data.
    refused = [str(problem) for problem in islice(problems(data), 20)]
    if refused:
        raise ConfigError(refused)
    errors = _credential_errors(data)
    if errors:
        raise ConfigError(errors)  # nothing else is reported next to a key value
    unknown = sorted(set(data) - {"version", *_SECTIONS, "budgets"})
    if unknown:
        errors.append(
            f"unknown top-level key(s) {', '.join(unknown)}; expected version, "
            + ", ".join(_SECTIONS)
            + ", budgets."
        )
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION or isinstance(version, bool):
        errors.append(f"version: only format version {FORMAT_VERSION} is supported.")
    state = DesiredState()
    for section in _SECTIONS:
        tables = data.get(section, {})
        if not isinstance(tables, Mapping):
            errors.append(f"{section}: expected a table of named tables ([{section}.NAME]).")
            continue
        for name, table in tables.items():
            path = f"{section}.{name}"
            if not _slug_ok(name):
                errors.append(f"{path}: names are 1-64 letters, digits, '-' or '_'.")
                continue
            if not isinstance(table, Mapping):
                errors.append(f"{path}: expected a table.")
                continue
            if section == "providers":
                state.providers[name] = _fields_from(Provider, table, path, errors)
            elif section == "chains":
                values = _fields_from(Chain, table, path, errors, extra=frozenset({"entries"}))
                values["entries"] = _parse_entries(table.get("entries", []), path, errors)
                state.chains[name] = values
            else:
                values = _fields_from(RoutingRule, table, path, errors, extra=frozenset({"chain"}))
                chain = table.get("chain")
                if not isinstance(chain, str) or not chain:
                    errors.append(f"{path}.chain: required; the name of a chain.")
                values["chain"] = chain
                state.rules[name] = values
    state.budgets = _parse_budgets(data.get("budgets", []), errors)
    defaults = sorted(n for n, c in state.chains.items() if c.get("is_default"))
    if len(defaults) > 1:
        errors.append(f"chains: at most one chain may be the default ({', '.join(defaults)}).")
    if errors:
        raise ConfigError(errors)
    return state


def _parse_budgets(raw: Any, errors: list[str]) -> dict[str, dict[str, Any]]:
    """``[[budgets]]``: an array of tables, each with its ``name``."""
    if not isinstance(raw, list):
        errors.append("budgets: expected an array of tables ([[budgets]]).")
        return {}
    out: dict[str, dict[str, Any]] = {}
    for i, table in enumerate(raw):
        path = f"budgets[{i}]"
        if not isinstance(table, Mapping):
            errors.append(f"{path}: expected a table.")
            continue
        name = table.get("name")
        if not isinstance(name, str) or not _slug_ok(name):
            errors.append(f"{path}.name: required; 1-64 letters, digits, '-' or '_'.")
            continue
        if name in out:
            errors.append(f"{path}.name: budget {name!r} appears twice.")
            continue
        out[name] = _fields_from(
            Budget, table, f"budgets.{name}", errors, extra=frozenset({"name"})
        )
    return out


def _decimals(model: type[models.Model], values: Mapping[str, Any]) -> dict[str, Any]:
    """Row values with the file's numbers as Decimals where the model stores Decimals."""
    out = dict(values)
    for f in _scalar_fields(model):
        if isinstance(f, models.DecimalField) and out.get(f.name) is not None:
            out[f.name] = Decimal(repr(out[f.name]))
    return out


def _parse_member(
    item: Any, epath: str, errors: list[str], seen: set[str]
) -> dict[str, Any] | None:
    """One entry: a provider name or an inline table (``provider``, ``model``,
    ``enabled``, ``weight``)."""
    table = {"provider": item} if isinstance(item, str) else item
    if not isinstance(table, Mapping):
        errors.append(f"{epath}: expected a provider name or an inline table.")
        return None
    for structural in ("step", "strategy"):
        if structural in table:
            errors.append(
                f"{epath}.{structural}: set by the file's structure; write a step of "
                'several as { any = [...], strategy = "weighted" }.'
            )
    values = _fields_from(
        ChainEntry,
        {k: v for k, v in table.items() if k not in ("step", "strategy")},
        epath,
        errors,
        extra=frozenset({"provider"}),
    )
    provider = table.get("provider")
    if not isinstance(provider, str) or not provider:
        errors.append(f"{epath}.provider: required; the name of a provider.")
        return None
    if provider in seen:
        errors.append(f"{epath}: provider {provider!r} appears twice in this chain.")
    seen.add(provider)
    return {"provider": provider, **values}


def _parse_entries(raw: Any, path: str, errors: list[str]) -> list[dict[str, Any]]:
    """The chain's entries, flat and in order: a step of several
    (``{ any = [...], strategy = ... }``) gives each of its members the step's index as
    ``step`` and its strategy; a step of one has neither."""
    if not isinstance(raw, list):
        errors.append(f"{path}.entries: expected an array.")
        return []
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        epath = f"{path}.entries[{i}]"
        if not (isinstance(item, Mapping) and "any" in item):
            if (entry := _parse_member(item, epath, errors, seen)) is not None:
                entries.append(entry)
            continue
        unknown = sorted(set(item) - {"any", "strategy"})
        if unknown:
            errors.append(
                f"{epath}: unknown field(s) {', '.join(unknown)}; expected any, strategy."
            )
        strategy = item.get("strategy", "weighted")
        if strategy not in STRATEGIES:
            errors.append(f"{epath}.strategy: expected one of {', '.join(STRATEGIES)}.")
        members = item["any"]
        if not isinstance(members, list) or not members:
            errors.append(f"{epath}.any: expected a non-empty array of entries.")
            continue
        for j, member in enumerate(members):
            entry = _parse_member(member, f"{epath}.any[{j}]", errors, seen)
            if entry is not None:
                entries.append({**entry, "step": i, "strategy": strategy})
    return entries


# --- current state, diff, plan --------------------------------------------------------


def _current() -> DesiredState:
    state = DesiredState()
    for p in Provider.objects.order_by("name"):
        state.providers[p.name] = _row_values(p)
    for c in Chain.objects.order_by("name").prefetch_related("entries__provider"):
        values = _row_values(c)
        values["entries"] = [
            {"provider": e.provider.name, **_row_values(e)}
            for e in sorted(c.entries.all(), key=lambda e: (e.position, e.pk))
        ]
        state.chains[c.name] = values
    for r in RoutingRule.objects.order_by("priority", "name").select_related("chain"):
        state.rules[r.name] = {**_row_values(r), "chain": r.chain.name}
    for b in Budget.objects.order_by("name"):
        state.budgets[b.name] = _row_values(b)
    return state


def _show(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return "[" + ", ".join(_entry_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _entry_text(entry: Mapping[str, Any]) -> str:
    extras = [f"{k}={_show(v)}" for k, v in _canonical_table(ChainEntry, entry).items()]
    return entry["provider"] + (f"({', '.join(extras)})" if extras else "")


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{k} {_show(old.get(k))} -> {_show(v)}" for k, v in new.items() if old.get(k) != v
    )


def _summary(values: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        f"{k}={_show(values[k])}"
        for k in keys
        if values.get(k) is not False and values.get(k) != ""
    )


def _plan(desired: DesiredState, *, prune: bool) -> tuple[list[Change], list[str]]:
    """Changes needed to reach ``desired``, and every validation error (read-only)."""
    current = _current()
    errors: list[str] = []
    changes: list[Change] = []

    known_providers = set(desired.providers) | (set() if prune else set(current.providers))
    known_chains = set(desired.chains) | (set() if prune else set(current.chains))
    for name, chain in desired.chains.items():
        for i, entry in enumerate(chain["entries"]):
            if entry["provider"] not in known_providers:
                errors.append(
                    f"chains.{name}.entries[{i}]: unknown provider {entry['provider']!r}"
                    + (" (--prune removes providers that are not in the file)" if prune else "")
                    + "."
                )
    for name, rule in desired.rules.items():
        if rule["chain"] not in known_chains:
            errors.append(f"rules.{name}.chain: unknown chain {rule['chain']!r}.")

    errors.extend(_validate_rows(desired))

    for kind, want, have in (
        ("provider", desired.providers, current.providers),
        ("chain", desired.chains, current.chains),
        ("rule", desired.rules, current.rules),
        ("budget", desired.budgets, current.budgets),
    ):
        for name, values in want.items():
            if name not in have:
                keys = {
                    "provider": ("kind", "model", "api_key_env"),
                    "chain": ("is_default", "entries"),
                    "rule": ("priority", "route", "task_glob", "chain"),
                    "budget": ("scope", "window", "max_requests", "max_tokens", "max_cost_usd"),
                }[kind]
                changes.append(Change("+", kind, name, _summary(values, keys)))
            else:
                details = _diff(have[name], values)
                if details:
                    changes.append(Change("~", kind, name, details))
    # A default chain in the file takes the default from any other chain.
    new_default = next((n for n, c in desired.chains.items() if c["is_default"]), None)
    if new_default is not None:
        for name, chain in current.chains.items():
            if chain["is_default"] and name != new_default and name not in desired.chains:
                if not prune:
                    changes.append(Change("~", "chain", name, ("is_default true -> false",)))
    if prune:
        for kind, want, have in (
            ("rule", desired.rules, current.rules),
            ("chain", desired.chains, current.chains),
            ("provider", desired.providers, current.providers),
            ("budget", desired.budgets, current.budgets),
        ):
            changes.extend(Change("-", kind, name) for name in have if name not in want)
    return changes, errors


def _validate_rows(desired: DesiredState) -> list[str]:
    """``full_clean`` every row the file declares, against the rows as they are now."""
    errors: list[str] = []
    existing = {
        "providers": {p.name: p.pk for p in Provider.objects.only("pk", "name")},
        "chains": {c.name: c.pk for c in Chain.objects.only("pk", "name")},
        "rules": {r.name: r.pk for r in RoutingRule.objects.only("pk", "name")},
        "budgets": {b.name: b.pk for b in Budget.objects.only("pk", "name")},
    }

    def clean(obj: models.Model, path: str, exclude: list[str], constraints: bool) -> None:
        if obj.pk is not None:
            obj._state.adding = False  # an update: uniqueness is checked against the others
        try:
            obj.full_clean(exclude=exclude, validate_constraints=constraints)
        except ValidationError as exc:
            for fname, messages in exc.message_dict.items():
                where = path if fname == "__all__" else f"{path}.{fname}"
                errors.extend(f"{where}: {m}" for m in messages)

    for name, values in desired.providers.items():
        obj = Provider(pk=existing["providers"].get(name), name=name, **_decimals(Provider, values))
        clean(obj, f"providers.{name}", [], True)
    for name, values in desired.chains.items():
        fields = {k: v for k, v in values.items() if k != "entries"}
        # The single-default constraint is checked by parse() and handled by the plan.
        clean(
            Chain(pk=existing["chains"].get(name), name=name, **fields), f"chains.{name}", [], False
        )
        for i, entry in enumerate(values["entries"]):
            efields = {k: v for k, v in entry.items() if k != "provider"}
            clean(
                ChainEntry(position=i, **efields),
                f"chains.{name}.entries[{i}]",
                ["chain", "provider"],
                False,
            )
    for name, values in desired.rules.items():
        fields = {k: v for k, v in values.items() if k != "chain"}
        rule = RoutingRule(pk=existing["rules"].get(name), name=name, **fields)
        clean(rule, f"rules.{name}", ["chain"], False)
    for name, values in desired.budgets.items():
        budget = Budget(pk=existing["budgets"].get(name), name=name, **_decimals(Budget, values))
        clean(budget, f"budgets.{name}", [], True)
    return errors


# --- apply / export -------------------------------------------------------------------


def apply(text: str, *, prune: bool = False, dry_run: bool = False) -> list[Change]:
    """Make the database match the file. Returns the changes (made, or due with dry_run).

    Raises :class:`ConfigError` (nothing written) when anything in the file is invalid.
    """
    desired = loads(text)
    with transaction.atomic():
        changes, errors = _plan(desired, prune=prune)
        if errors:
            raise ConfigError(errors)
        if dry_run or not changes:
            return changes
        try:
            _write(desired, prune=prune)
        except (IntegrityError, ValidationError) as exc:
            # Not expected after validation (a concurrent edit): roll everything back.
            raise ConfigError([f"database refused the change: {exc}"]) from None
    return changes


def _write(desired: DesiredState, *, prune: bool) -> None:
    new_default = next((n for n, c in desired.chains.items() if c["is_default"]), None)
    if new_default is not None:
        Chain.objects.filter(is_default=True).exclude(name=new_default).update(is_default=False)
    if prune:
        RoutingRule.objects.exclude(name__in=list(desired.rules)).delete()
    providers: dict[str, Provider] = {}
    for name, values in desired.providers.items():
        obj = Provider.objects.filter(name=name).first() or Provider(name=name)
        if obj.pk is None or _row_values(obj) != values:
            for k, v in _decimals(Provider, values).items():
                setattr(obj, k, v)
            obj.save()
        providers[name] = obj
    chains: dict[str, Chain] = {}
    for name, values in desired.chains.items():
        fields = {k: v for k, v in values.items() if k != "entries"}
        obj_c = Chain.objects.filter(name=name).first() or Chain(name=name)
        if obj_c.pk is None or _row_values(obj_c) != fields:
            for k, v in fields.items():
                setattr(obj_c, k, v)
            obj_c.save()
        chains[name] = obj_c
        have = [
            {"provider": e.provider.name, **_row_values(e)}
            for e in obj_c.entries.select_related("provider").order_by("position", "pk")
        ]
        if have != values["entries"]:
            obj_c.entries.all().delete()
            for i, entry in enumerate(values["entries"]):
                provider = providers.get(entry["provider"]) or Provider.objects.get(
                    name=entry["provider"]
                )
                efields = {k: v for k, v in entry.items() if k != "provider"}
                ChainEntry.objects.create(chain=obj_c, provider=provider, position=i, **efields)
    for name, values in desired.rules.items():
        fields = {k: v for k, v in values.items() if k != "chain"}
        chain = chains.get(values["chain"]) or Chain.objects.get(name=values["chain"])
        obj_r = RoutingRule.objects.filter(name=name).first() or RoutingRule(name=name)
        if obj_r.pk is None or _row_values(obj_r) != fields or obj_r.chain_id != chain.pk:
            for k, v in fields.items():
                setattr(obj_r, k, v)
            obj_r.chain = chain
            obj_r.save()
    for name, values in desired.budgets.items():
        obj_b = Budget.objects.filter(name=name).first() or Budget(name=name)
        if obj_b.pk is None or _row_values(obj_b) != values:
            for k, v in _decimals(Budget, values).items():
                setattr(obj_b, k, v)
            obj_b.save()
    if prune:
        Budget.objects.exclude(name__in=list(desired.budgets)).delete()
        # Rules are already gone or retargeted; entries of removed chains cascade.
        Chain.objects.exclude(name__in=list(desired.chains)).delete()
        Provider.objects.exclude(name__in=list(desired.providers)).delete()


def _canonical_table(model: type[models.Model], values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in _scalar_fields(model):
        value = values.get(f.name)
        if value != _default(f):
            if isinstance(f, HedgeAfterField) and isinstance(value, str) and value.isdigit():
                value = int(value)  # hedge_after_ms: a number stays a number
            out[f.name] = value
    return out


def _check_tomlable(value: Any, path: str, errors: list[str]) -> None:
    if value is None:
        errors.append(f"{path}: null cannot be written to TOML; edit the value in the admin.")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_tomlable(v, f"{path}.{k}", errors)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_tomlable(v, f"{path}[{i}]", errors)


def _dump_member(entry: Mapping[str, Any]) -> Any:
    extra = {k: v for k, v in _canonical_table(ChainEntry, entry).items() if k not in _STRUCTURAL}
    return {"provider": entry["provider"], **extra} if extra else entry["provider"]


def _dump_entries(entries: list[dict[str, Any]]) -> list[Any]:
    """A chain's entries as the file writes them: a step of several (entries sharing a
    step number, :func:`models.group_steps`) as ``{ any = [...], strategy = ... }``."""
    out: list[Any] = []
    for group in group_steps(_Stepped(e) for e in entries):
        if group[0].step is None:
            out.append(_dump_member(group[0].entry))
            continue
        strategy = group[0].entry.get("strategy") or "weighted"
        out.append({"any": [_dump_member(g.entry) for g in group], "strategy": strategy})
    return out


@dataclass(frozen=True)
class _Stepped:
    entry: dict[str, Any]

    @property
    def step(self) -> int | None:
        step = self.entry.get("step")
        return step if isinstance(step, int) else None


def dumps(state: DesiredState) -> str:
    """The canonical text of a state (see the module docstring)."""
    doc: dict[str, Any] = {"version": FORMAT_VERSION}
    providers = {n: _canonical_table(Provider, state.providers[n]) for n in sorted(state.providers)}
    chains: dict[str, Any] = {}
    for name in sorted(state.chains):
        values = state.chains[name]
        table = _canonical_table(Chain, values)
        table["entries"] = _dump_entries(values["entries"])
        chains[name] = table
    rules = {}
    for name in sorted(state.rules, key=lambda n: (state.rules[n]["priority"], n)):
        rules[name] = {**_canonical_table(RoutingRule, state.rules[name])}
        rules[name]["chain"] = state.rules[name]["chain"]
    budgets = []
    for name in sorted(state.budgets):
        table = _canonical_table(Budget, state.budgets[name])
        table.setdefault("window", state.budgets[name]["window"])  # always shown
        order = [f.name for f in _scalar_fields(Budget)]
        budgets.append({"name": name, **{k: table[k] for k in order if k in table}})
    errors: list[str] = []
    for section, tables in (("providers", providers), ("chains", chains), ("rules", rules)):
        if tables:
            doc[section] = tables
        _check_tomlable(tables, section, errors)
    if budgets:
        doc["budgets"] = budgets
    _check_tomlable(budgets, "budgets", errors)
    if errors:
        raise ConfigError(errors)
    return HEADER + tomli_w.dumps(doc)


def export() -> str:
    """The database's providers, chains, rules and budgets as canonical TOML text."""
    return dumps(_current())
