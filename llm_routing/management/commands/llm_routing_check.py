"""``manage.py llm_routing_check [--json]`` — providers, key presence, circuit state.

Key presence only: a key's value is never read into the output. The circuit column is
the state of the provider's own model circuit in the shared breaker store (plus any
override model's circuit that is not closed). The app's system checks (settings and
rows) are run and printed; the command fails when any of them is an error.
"""

from __future__ import annotations

import json
from typing import Any

from django.core import checks
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, router

from llm_routing.checks import check_configuration_rows, check_settings, requires_key
from llm_routing.models import Chain, Provider
from llm_routing.providers.registry import get_adapter_class, is_known_kind
from llm_routing.resilience import breaker
from llm_routing.types import CAPABILITIES

__all__ = ["Command", "circuit_states", "effective_capabilities"]


def effective_capabilities(provider: Provider) -> dict[str, bool] | None:
    """Capability -> what the router uses for this row (the row's override, else the
    kind's declaration); None when the kind cannot be loaded."""
    kind = "mock" if provider.mode == "mock" else provider.kind
    try:
        adapter = get_adapter_class(kind)(provider.to_config())
    except Exception:  # an unknown or broken kind is reported by the checks below
        return None
    return {cap: adapter.supports(cap) for cap in CAPABILITIES}


def _capability_text(provider: Provider, effective: dict[str, bool] | None) -> str:
    if effective is None:
        return "?"
    shown = []
    for cap, on in effective.items():
        override = getattr(provider, f"supports_{cap}", None)
        if on or override is not None:
            shown.append(("" if on else "no ") + cap + ("*" if override is not None else ""))
    return ",".join(shown) or "-"


def circuit_states(providers: list[Provider]) -> dict[str, str]:
    """Provider name -> state of its own model's circuit, plus any override model's
    circuit that is not closed (``closed; gpt-4o: open``)."""
    store = getattr(breaker, "store", None)
    if store is None or not hasattr(store, "for_providers"):
        return {p.name: "n/a" for p in providers}
    try:
        circuits = store.for_providers(providers)
        now = store.clock()
    except Exception:  # a diagnostic must not crash on a broken cache
        return {p.name: "unknown" for p in providers}
    out: dict[str, str] = {}
    for p in providers:
        if p.effective_mode == "mock":
            out[p.name] = "n/a"  # answered offline: no upstream, no circuit
            continue
        own, *overrides = circuits.get(p.name) or [None]
        text = str(own.phase(now)) if own is not None else "n/a"
        for circuit in overrides:
            phase = str(circuit.phase(now))
            if phase != "closed":
                text += f"; {circuit.model}: {phase}"
        out[p.name] = text
    return out


class Command(BaseCommand):
    help = "List providers with key presence and circuit state, and run the app's checks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Machine-readable output.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            providers = list(Provider.objects.order_by("name"))
        except DatabaseError as exc:
            raise CommandError(
                f"Cannot read the providers ({type(exc).__name__}); has `migrate` run?"
            ) from None
        states = circuit_states(providers)
        rows = []
        for p in providers:
            effective = effective_capabilities(p)
            rows.append(
                {
                    "name": p.name,
                    "kind": p.kind + ("" if is_known_kind(p.kind) else " (unknown)"),
                    "model": p.model,
                    "enabled": p.enabled,
                    "mode": p.effective_mode,
                    "api_key_env": p.api_key_env,
                    "key_required": requires_key(p.kind, p.to_config())
                    and p.effective_mode != "mock",
                    "key_present": p.key_present,
                    "circuit": states[p.name],
                    "capabilities": effective,
                    "capability_overrides": {
                        cap: getattr(p, f"supports_{cap}")
                        for cap in CAPABILITIES
                        if getattr(p, f"supports_{cap}", None) is not None
                    },
                    "capabilities_text": _capability_text(p, effective),
                }
            )
        default = Chain.objects.filter(is_default=True).values_list("name", flat=True).first()
        alias = router.db_for_read(Provider) or "default"
        messages = [*check_settings(), *check_configuration_rows(databases=[alias])]
        errors = [m for m in messages if m.level >= checks.ERROR]
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "providers": [
                            {k: v for k, v in r.items() if k != "capabilities_text"} for r in rows
                        ],
                        "default_chain": default,
                        "checks": [
                            {"id": m.id, "level": m.level, "msg": m.msg, "hint": m.hint}
                            for m in messages
                        ],
                    },
                    indent=2,
                )
            )
        else:
            self._table(rows)
            self.stdout.write(f"\ndefault chain: {default or '(none)'}")
            for m in messages:
                style = self.style.ERROR if m.level >= checks.ERROR else self.style.WARNING
                self.stdout.write(
                    style(f"{m.id}: {m.msg}") + (f"\n    hint: {m.hint}" if m.hint else "")
                )
            if not messages:
                self.stdout.write(self.style.SUCCESS("No problems found."))
        if errors:
            raise CommandError(f"{len(errors)} error(s) in the LLM routing configuration.")

    def _table(self, rows: list[dict[str, Any]]) -> None:
        headers = [
            "name",
            "kind",
            "model",
            "enabled",
            "mode",
            "key variable",
            "key",
            "circuit",
            "capabilities",
        ]
        table = [
            [
                r["name"],
                r["kind"],
                r["model"] or "-",
                "yes" if r["enabled"] else "no",
                r["mode"],
                r["api_key_env"] or "-",
                "present"
                if r["key_present"]
                else ("missing" if r["key_required"] else "not needed"),
                r["circuit"],
                r["capabilities_text"],
            ]
            for r in rows
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *table, strict=False)]
        for line in [headers, *table]:
            self.stdout.write(
                "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            )
        if not rows:
            self.stdout.write("(no providers; the built-in mock answers every request)")
        elif any("*" in r["capabilities_text"] for r in rows):
            self.stdout.write("* set on the row; other capabilities come from the kind")
