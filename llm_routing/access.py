"""Who may route where (docs/operations.md, "Who may route where").

* A chain whose ``allowed_users`` and ``allowed_groups`` are both empty is open to
  everyone; otherwise only to those users and the members of those groups. Chains from
  settings (``DEFAULT_CHAIN``, ``ROUTES``) are open to everyone.
* Naming a provider (``provider``, ``/v1`` ``model=<provider>``) that is in no chain the
  caller may use needs the ``llm_routing.route_any_provider`` permission, which also
  opens every chain.
* ``force_provider`` needs ``llm_routing.force_provider`` (and, for a provider outside
  the caller's chains, ``route_any_provider`` too).
* Staff users and superusers hold both permissions. A request without a
  :class:`~llm_routing.types.Principal` (the Python API, management commands) is trusted.

The API layer turns a refusal into a 403 for a permission the caller lacks, or the 404
of a name that does not exist for a chain or provider they may not see
(:func:`refusal`); a routing rule whose chain they may not use does not apply to them
(:meth:`~llm_routing.snapshot.ConfigSnapshot.first_matching_rule`); the router skips a
candidate they may not use as ``not_allowed`` (:func:`denied_candidates`). All read the
config snapshot (:mod:`llm_routing.snapshot`), not the chain rows.

Who sees what (docs/operations.md, "Who sees what") is decided by one function,
:func:`may_see`: a :class:`Viewer` (a caller, or an operator: staff, a superuser, a
holder of ``METRICS_TOKEN``) may see a chain, a route key or a provider name only when
they may use it, and the operations view (every provider row, its key presence and
circuit) only as an operator. Explain, ``/health/``, ``/v1/models``, ``/v1`` errors and
``/audit/``'s refusals all ask it; what a caller may not see answers exactly as what
does not exist, and the caller's copy of a decision leaves it out
(:func:`visible_routed`; the decision row keeps everything).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from django.db.models import Q, QuerySet

from .conf import routing_settings
from .models import Chain
from .snapshot import ConfigSnapshot, current
from .types import MOCK_PROVIDER_NAME, AuditRequest, Principal, RoutingResult

__all__ = [
    "FORCE_PERMISSION",
    "NOBODY",
    "ROUTE_ANY_PERMISSION",
    "TRUSTED",
    "Refusal",
    "Viewer",
    "allowed_chains",
    "chain_allowed",
    "denied_candidates",
    "holds_operator_token",
    "may_see",
    "principal_for",
    "provider_allowed",
    "refusal",
    "unseen",
    "viewer_for",
    "visible_picks",
    "visible_routed",
]

FORCE_PERMISSION = "llm_routing.force_provider"
ROUTE_ANY_PERMISSION = "llm_routing.route_any_provider"


def principal_for(user: Any) -> Principal:
    """The routing identity of a Django user (authenticated or anonymous)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return Principal()
    # Computed once per user object: a token-authenticated user object is reused for a
    # few seconds (llm_routing.api.authentication), and with it this answer.
    memo = getattr(user, "_llm_routing_principal", None)
    if isinstance(memo, Principal):
        return memo
    memo = _principal_of(user)
    try:
        user._llm_routing_principal = memo
    except AttributeError:  # a user object that takes no attributes
        pass
    return memo


def _principal_of(user: Any) -> Principal:
    trusted = bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))
    groups = getattr(user, "groups", None)
    group_ids = frozenset(groups.values_list("pk", flat=True) if groups is not None else ())
    return Principal(
        user_id=user.pk,
        group_ids=group_ids,
        can_force_provider=trusted or user.has_perm(FORCE_PERMISSION),
        can_route_any_provider=trusted or user.has_perm(ROUTE_ANY_PERMISSION),
    )


def allowed_chains(principal: Principal) -> QuerySet[Chain]:
    """The chain rows this principal may use (all of them with ``route_any_provider``)."""
    if principal.can_route_any_provider:
        return Chain.objects.all()
    mine = Q(allowed_users__isnull=True, allowed_groups__isnull=True)
    if principal.user_id is not None:
        mine |= Q(allowed_users__pk=principal.user_id)
    if principal.group_ids:
        mine |= Q(allowed_groups__pk__in=principal.group_ids)
    return Chain.objects.filter(mine).distinct()


def chain_allowed(
    name: str, principal: Principal | None, config: ConfigSnapshot | None = None
) -> bool:
    """Whether the principal may use the chain row ``name`` (True for no such row)."""
    if principal is None:
        return True
    chain = (config or current()).chain(name)
    return chain is None or chain.allows(principal)


def _settings_provider_names() -> set[str]:
    names = {str(n) for n in routing_settings.DEFAULT_CHAIN or []}
    for providers in (routing_settings.ROUTES or {}).values():
        names.update(str(n) for n in providers)
    return names


def provider_allowed(
    name: str, principal: Principal | None, config: ConfigSnapshot | None = None
) -> bool:
    """Whether the principal may name ``name``: it is the mock, in a chain they may use,
    in a settings chain, or they hold ``route_any_provider``."""
    if principal is None or principal.can_route_any_provider or name == MOCK_PROVIDER_NAME:
        return True
    if name in _settings_provider_names():
        return True
    return any(
        chain.allows(principal) and any(e.provider == name for e in chain.entries)
        for chain in (config or current()).chains.values()
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a caller may not make a request: ``status`` 403 (a permission they lack,
    whatever they named) or 404 (a name they may not see, answered as one that does
    not exist), a machine-readable ``code`` and the words."""

    status: int
    code: str
    message: str


def refusal(
    request: AuditRequest, viewer: Viewer | None = None, config: ConfigSnapshot | None = None
) -> Refusal | None:
    """Why this caller may not make this request (:class:`Refusal`), or None.

    First the permission to force a provider (a 403 for any name, so it tells nothing
    of names); then a ``chain`` that does not exist, and every name the request gives —
    ``chain``, ``force_provider``, ``provider`` — that ``viewer`` (default: the
    request's principal, not an operator) may not see (:func:`may_see`), is the same
    404 in the same words, so names cannot be enumerated."""
    principal = request.principal
    if principal is None:
        return None
    viewer = viewer if viewer is not None else Viewer(principal=principal)
    config = config or current()
    if request.force_provider and not principal.can_force_provider:
        return Refusal(
            403,
            "permission_denied",
            f"Forcing a provider needs the {FORCE_PERMISSION} permission.",
        )
    chain = request.chain
    if chain and (
        config.chain(chain) is None or not may_see(viewer, "chain", chain, config=config)
    ):
        return Refusal(404, "unknown_chain", unseen("chain", chain))
    for name in (request.force_provider, request.provider):
        if name and not may_see(viewer, "provider", name, config=config):
            return Refusal(404, "unknown_provider", unseen("provider", name))
    return None


def unseen(what: Literal["chain", "provider"], name: str) -> str:
    """The words of a 404 for a chain or provider that does not exist or that the
    caller may not use: the same for both."""
    return f"No {what} {name!r} that you may use."


def denied_candidates(
    *,
    principal: Principal | None,
    names: Iterable[str],
    chain_name: str | None,
    requested_provider: str | None,
    forced: bool,
    config: ConfigSnapshot | None = None,
) -> frozenset[str]:
    """The candidates of a plan this principal may not use (the router skips them as
    ``not_allowed``): all of a chain row they may not use, a named provider outside
    their chains, a forced provider without the permissions. Never the mock."""
    if principal is None:
        return frozenset()
    config = config or current()
    names = [n for n in names if n != MOCK_PROVIDER_NAME]
    if forced:
        ok = all(
            principal.can_force_provider and provider_allowed(n, principal, config) for n in names
        )
        return frozenset() if ok else frozenset(names)
    denied: set[str] = set()
    if chain_name and not chain_allowed(chain_name, principal, config):
        denied.update(names)
    if requested_provider and requested_provider != MOCK_PROVIDER_NAME:
        if provider_allowed(requested_provider, principal, config):
            denied.discard(requested_provider)
        else:
            denied.add(requested_provider)
    return frozenset(denied)


# --- who sees what ---------------------------------------------------------------------

#: What :func:`may_see` answers about: a chain, a route key, a provider (its name, model,
#: circuit as explain shows it), or ``operations`` (every provider row with its key
#: presence, mode and circuits: the full ``/health/`` list).
Seen = Literal["chain", "route", "provider", "operations"]


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking. ``principal`` None is trusted code (the Python API, management
    commands, the admin's own pages); ``operator`` is staff, a superuser or a holder of
    the ``METRICS_TOKEN``: both see everything."""

    principal: Principal | None = None
    operator: bool = False


#: The viewer of trusted code: sees everything.
TRUSTED = Viewer()
#: An anonymous caller: sees only what everyone may use.
NOBODY = Viewer(principal=Principal())


def viewer_for(user: Any, *, operator_token: bool = False) -> Viewer:
    """The viewer of a Django user (authenticated or anonymous); ``operator_token``:
    the request carried the ``METRICS_TOKEN`` (:func:`holds_operator_token`)."""
    staff = bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and getattr(user, "is_active", True)
        and (getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))
    )
    return Viewer(principal=principal_for(user), operator=staff or operator_token)


def holds_operator_token(headers: Mapping[str, str]) -> bool:
    """Whether ``Authorization: Bearer <METRICS_TOKEN>`` is among these request headers
    (compared in constant time; False while no token is set)."""
    token = routing_settings.METRICS_TOKEN
    if not token:
        return False
    scheme, _, given = (headers.get("Authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), str(token).encode()
    )


def may_see(
    viewer: Viewer,
    what: Seen,
    name: str = "",
    *,
    task: str | None = None,
    config: ConfigSnapshot | None = None,
) -> bool:
    """The one visibility rule: whether ``viewer`` may see ``what`` called ``name``.

    Trusted code and operators see everything. A caller sees a chain they may use
    (:func:`chain_allowed`), a provider they may name (:func:`provider_allowed`; the mock
    always), and a route key from ``ROUTES`` or with a rule (one matching ``task``,
    when any does) leading to a chain they may use — a rule leading elsewhere does not
    apply to them (:meth:`~llm_routing.snapshot.ConfigSnapshot.first_matching_rule`);
    never ``operations``. A name that does not exist is not seen either, so "absent"
    and "not yours" answer alike."""
    principal = viewer.principal
    if principal is None or viewer.operator:
        return True
    if what == "operations":
        return False
    config = config or current()
    if what == "chain":
        chain = config.chain(name)
        return chain is not None and chain.allows(principal)
    if what == "provider":
        if name != MOCK_PROVIDER_NAME and config.provider(name) is None:
            return False
        return provider_allowed(name, principal, config)
    if name in (routing_settings.ROUTES or {}):
        return True
    keyed = [r for r in config.rules if r.route == name]
    matching = [r for r in keyed if task is None or r.matches(task=task, route=name)]
    return any(r.chain.allows(principal) for r in matching or keyed)


def visible_picks(
    picks: Iterable[Mapping[str, Any]], shown: Callable[[str], bool]
) -> tuple[Mapping[str, Any], ...]:
    """``routing_metadata.picks`` (or explain's) with only the providers ``shown``
    admits: a hidden name leaves a pick's order and its weights, counts and scores, and
    a pick whose picked candidate is hidden is left out whole (it would name it)."""
    out: list[Mapping[str, Any]] = []
    for pick in picks:
        picked = pick.get("picked")
        if picked is not None and not shown(picked):
            continue
        kept = dict(pick)
        kept["order"] = [n for n in pick.get("order", ()) if shown(n)]
        for key in ("weights", "counts", "scores"):
            if isinstance(pick.get(key), Mapping):
                kept[key] = {n: v for n, v in pick[key].items() if shown(n)}
        out.append(kept)
    return tuple(out)


def visible_routed(
    routed: RoutingResult, viewer: Viewer, config: ConfigSnapshot | None = None
) -> RoutingResult:
    """``routed`` as ``viewer`` may see it: the caller's copy of a decision (the
    ``/audit/`` envelope and its stream's ``result``, an async job's result, the
    ``/v1`` routing headers). The decision row keeps everything, for operators.

    A candidate skipped as ``not_allowed`` and any provider ``viewer`` may not see
    (:func:`may_see`) are left out — of ``attempts``, ``skipped_providers`` and the
    ``chain`` list — as if the chain did not hold them, so the caller learns no name
    outside what they may use, not even that such a candidate was there; a chain they
    may not see (and its rule) is not named; ``fallback_reason`` is then the first
    reason among what is shown (``chain_exhausted`` stays); an error result from a
    provider they may not see names no provider. Operators and trusted code see it
    whole."""
    if viewer.principal is None or viewer.operator:
        return routed
    config = config or current()
    meta = routed.metadata

    def shown(name: str) -> bool:
        return may_see(viewer, "provider", name, config=config)

    attempts = tuple(a for a in meta.attempts if a.reason != "not_allowed" and shown(a.provider))
    chain_name, rule = meta.chain_name, meta.rule
    if chain_name and config.chain(chain_name) is not None:
        if not may_see(viewer, "chain", chain_name, config=config):
            chain_name, rule = None, None
    fallback_reason = meta.fallback_reason
    if len(attempts) != len(meta.attempts) and fallback_reason != "chain_exhausted":
        fallback_reason = next((a.reason for a in attempts if not a.served), None)
    result = routed.result
    if result.provider and not shown(result.provider):
        result = replace(result, provider="", model="")
    dropped = {a.provider for a in meta.attempts if a.reason == "not_allowed"}
    chain = tuple(n for n in meta.chain if n not in dropped and shown(n))
    picks = visible_picks(meta.picks, lambda n: n not in dropped and shown(n))
    if (chain, attempts, chain_name, result, picks) == (
        meta.chain,
        meta.attempts,
        meta.chain_name,
        routed.result,
        meta.picks,
    ):
        return routed  # nothing to hide: the decision as it is
    metadata = replace(
        meta,
        chain_name=chain_name,
        rule=rule,
        selected_provider=result.provider,
        chain=chain,
        attempts=attempts,
        fallback_used=fallback_reason is not None,
        fallback_reason=fallback_reason,
        picks=picks,
    )
    return replace(routed, result=result, metadata=metadata)
