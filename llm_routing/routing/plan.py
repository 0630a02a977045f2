"""Step 1 of the routing algorithm and what a session reads before its walk: the
:class:`Plan` (:func:`resolve`: forced, a named chain, the first matching rule whose
chain the caller may use, the default chain, the settings' routes; an explicit
provider first; the mock backstop last; the chain's steps, :class:`PlanStep`), the
request's prompt-cache affinity key (:func:`affinity_key`), the candidates the caller
may not use (:func:`_denied`), each candidate's adapter (:func:`_adapter_for`,
:func:`_mock_config`), the output ceiling a candidate may send
(:func:`with_output_ceiling`) and the ``Setup`` effect.

Reads the configuration snapshot only: no rows, no writes (docs/architecture.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ..access import denied_candidates
from ..conf import routing_settings
from ..dbconn import release_pooled_connections
from ..effects import (
    Context,
    Effect,
)
from ..models import Provider
from ..providers.base import BaseProvider
from ..providers.mock import MockProvider
from ..providers.registry import get_adapter, is_known_kind
from ..snapshot import ChainSpec, ConfigSnapshot, RuleSpec, acurrent, current
from ..strategies import Candidate
from ..types import (
    MOCK_PROVIDER_NAME,
    AuditRequest,
    ProviderConfig,
    RouterMode,
)

#: The logger operators configure for the router (docs/providers.md).
logger = logging.getLogger("llm_routing.router")


@dataclass(frozen=True)
class PlanStep:
    """One step of a plan: a strategy (``""`` for a step of one) and its members."""

    strategy: str
    members: tuple[Candidate, ...]

    @property
    def applied(self) -> str:
        """The strategy the walk applies: none for a step of one (whatever it names)."""
        return self.strategy if len(self.members) > 1 else ""


@dataclass(frozen=True)
class Plan:
    """Step 1's answer: which candidates, in which order, and why. ``steps`` groups
    ``candidates`` (in the same order) into the chain's steps; empty: a step each."""

    router_mode: RouterMode
    candidates: tuple[tuple[str, str], ...]  # (provider name, model override)
    chain_name: str | None = None
    rule: str | None = None
    requested_provider: str | None = None
    configured: bool = True  # False when nothing but the mock backstop was found
    stream_mode: str = "direct"  # the chain's mid-stream failure policy
    backstop: bool = True  # whether the mock backstop ends the candidates
    steps: tuple[PlanStep, ...] = ()
    affinity_from_user: bool = False  # the chain takes the OpenAI user as affinity key
    hedge_after_ms: str = ""  # the chain's hedging: "", milliseconds, or "p95"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.candidates)

    def step_of(self, name: str) -> int | None:
        """The index of the step ``name`` is in (None: not a candidate)."""
        for index, step in enumerate(self.step_list()):
            if any(c.name == name for c in step.members):
                return index
        return None

    def step_list(self) -> tuple[PlanStep, ...]:
        """The steps, a step of one per candidate when the plan has none."""
        if self.steps:
            return self.steps
        return tuple(PlanStep("", (Candidate(n, m),)) for n, m in self.candidates)


def _steps_of(groups: list[tuple[str, list[Candidate]]], *, add_mock: bool) -> tuple[PlanStep, ...]:
    """The steps, each provider once (its first place), empty steps dropped, the mock
    backstop last as a step of its own."""
    seen: set[str] = set()
    out: list[PlanStep] = []
    mock = Candidate(MOCK_PROVIDER_NAME)
    for strategy, members in groups:
        kept: list[Candidate] = []
        for member in members:
            if member.name in seen:
                continue
            seen.add(member.name)
            if member.name == MOCK_PROVIDER_NAME:
                mock = Candidate(member.name, member.model)
                continue
            kept.append(member)
        if kept:
            out.append(PlanStep(strategy if len(kept) > 1 else "", tuple(kept)))
    if add_mock or MOCK_PROVIDER_NAME in seen:
        out.append(PlanStep("", (mock,)))
    return tuple(out)


def _chain_groups(chain: ChainSpec) -> list[tuple[str, list[Candidate]]]:
    return [
        (strategy, [Candidate(e.provider, e.model, e.weight) for e in entries])
        for strategy, entries in chain.steps()
    ]


_Steps = tuple[tuple[PlanStep, ...], tuple[tuple[str, str], ...]]
#: A chain's steps and flat candidates per (chain spec, backstop): a snapshot's chain
#: specs never change, so each is worked out once (checked by identity; bounded).
_chain_plans: dict[tuple[int, bool], tuple[ChainSpec, _Steps]] = {}
_CHAIN_PLANS_MAX = 512


def _with_candidates(steps: tuple[PlanStep, ...]) -> _Steps:
    return steps, tuple((c.name, c.model) for step in steps for c in step.members)


def _chain_plan(chain: ChainSpec, backstop: bool) -> _Steps:
    """:func:`_steps_of` a chain with no explicit provider in front, memoized."""
    key = (id(chain), backstop)
    cached = _chain_plans.get(key)
    if cached is not None and cached[0] is chain:
        return cached[1]
    planned = _with_candidates(_steps_of(_chain_groups(chain), add_mock=backstop))
    if len(_chain_plans) >= _CHAIN_PLANS_MAX:
        _chain_plans.clear()
    _chain_plans[key] = (chain, planned)
    return planned


def _first_matching_rule(request: AuditRequest, config: ConfigSnapshot) -> RuleSpec | None:
    # A rule whose chain the caller may not use does not apply to them (access rules).
    return config.first_matching_rule(
        task=request.task, route=request.route, principal=request.principal
    )


def resolve(request: AuditRequest, config: ConfigSnapshot | None = None) -> Plan:
    """Step 1 of the algorithm (reads the config snapshot — no rows — writes nothing)."""
    config = config if config is not None else current()
    if request.force_provider:
        return Plan(
            router_mode="forced",
            candidates=((request.force_provider, ""),),
            requested_provider=request.force_provider,
        )
    fallbacks: list[tuple[str, str]] = []
    spec: ChainSpec | None = None  # the chain whose steps these are (and its settings)
    stream_mode = "direct"
    chain_backstop = False  # the chain's own opt-in (Chain.mock_backstop)
    chain_name: str | None = None
    rule_name: str | None = None
    mode: RouterMode = "default"
    named = config.chain(request.chain) if request.chain else None
    rule = None if named is not None else _first_matching_rule(request, config)
    routes = routing_settings.ROUTES or {}
    if named is not None:
        fallbacks, spec = named.provider_names(), named
        chain_name, mode, stream_mode = named.name, "chain", named.stream_mode
        chain_backstop = named.mock_backstop
    elif rule is not None:
        fallbacks, spec = rule.chain.provider_names(), rule.chain
        chain_name, rule_name, mode = rule.chain.name, rule.name, "rule"
        stream_mode = rule.chain.stream_mode
        chain_backstop = rule.chain.mock_backstop
    elif request.route and request.route in routes:
        fallbacks = [(str(n), "") for n in routes[request.route]]
        chain_name = f"route:{request.route}"
    elif (default := config.default_chain) is not None:
        fallbacks, spec = default.provider_names(), default
        chain_name = default.name
        stream_mode = default.stream_mode
        chain_backstop = default.mock_backstop
    elif routing_settings.DEFAULT_CHAIN:
        fallbacks = [(str(n), "") for n in routing_settings.DEFAULT_CHAIN]
        chain_name = "settings"
    entries = list(fallbacks)
    backstop = request.backstop or chain_backstop
    if spec is not None and not request.provider:
        steps, candidates = _chain_plan(spec, backstop)
    else:
        groups = (
            _chain_groups(spec)
            if spec is not None
            else [("", [Candidate(n, m)]) for n, m in entries]
        )
        if request.provider == MOCK_PROVIDER_NAME:
            # The mock never fails, so an explicit mock primary is the whole walk.
            entries = [(MOCK_PROVIDER_NAME, "")]
            groups = [("", [Candidate(MOCK_PROVIDER_NAME)])]
        elif request.provider:
            entries.insert(0, (request.provider, ""))
            groups.insert(0, ("", [Candidate(request.provider)]))
        steps, candidates = _with_candidates(_steps_of(groups, add_mock=backstop))
    if request.provider:
        mode = "explicit"
    return Plan(
        router_mode=mode,
        candidates=candidates,
        chain_name=chain_name,
        rule=rule_name,
        requested_provider=request.provider,
        configured=bool(entries),
        stream_mode=stream_mode,
        backstop=backstop,
        steps=steps,
        affinity_from_user=spec is not None and spec.affinity_from_user,
        hedge_after_ms=spec.hedge_after_ms if spec is not None else "",
    )


def affinity_key(request: AuditRequest, plan: Plan) -> str | None:
    """The request's prompt-cache affinity key: its own (``affinity``, the
    ``X-LLM-Affinity`` header), else the OpenAI ``user`` field when the chain says
    ``affinity_from_user``; None: no affinity."""
    if request.affinity:
        return request.affinity
    if plan.affinity_from_user and request.user:
        return request.user
    return None


def _mock_config(row: Provider | None) -> ProviderConfig:
    if row is not None:
        config = row.to_config()
        # The backstop is always available and always offline.
        return replace(config, kind="mock", mode="mock", enabled=True)
    return ProviderConfig(
        name=MOCK_PROVIDER_NAME, kind="mock", model=routing_settings.MOCK_MODEL, mode="mock"
    )


def _denied(plan: Plan, request: AuditRequest, config: ConfigSnapshot) -> frozenset[str]:
    """The plan's candidates this request's caller may not use (``not_allowed``)."""
    return denied_candidates(
        principal=request.principal,
        names=plan.names,
        chain_name=plan.chain_name,
        requested_provider=plan.requested_provider,
        forced=plan.router_mode == "forced",
        config=config,
    )


def _adapter_for(name: str, model: str, row: Provider | None) -> BaseProvider | None:
    if name == MOCK_PROVIDER_NAME:
        config = _mock_config(row)
    elif row is None or not is_known_kind("mock" if row.mode == "mock" else row.kind):
        return None
    else:
        config = row.to_config()
    if model:
        config = config.with_model(model)
    try:
        return get_adapter(config)
    except Exception:  # an import error in a custom adapter must not crash routing
        logger.exception("Cannot build adapter for provider %s", name)
        if name == MOCK_PROVIDER_NAME:
            # The backstop always answers: the built-in mock stands in for a "mock"
            # kind override that cannot be imported.
            return MockProvider(config)
        return None


#: Row params that set a provider's output length (both are ceilings).
OUTPUT_PARAMS = ("max_tokens", "max_completion_tokens")


def _row_max_tokens(config: ProviderConfig) -> int | None:
    values = [
        v
        for k in OUTPUT_PARAMS
        if isinstance(v := (config.params or {}).get(k), int) and not isinstance(v, bool) and v > 0
    ]
    return min(values) if values else None


def with_output_ceiling(request: AuditRequest, config: ProviderConfig) -> AuditRequest:
    """The request as this candidate may send it: the ``max_tokens`` asked for (the
    client's, else the row's own) never above the row's params nor ``MAX_OUTPUT_TOKENS``.
    Applied per candidate, before any adapter builds a payload."""
    row = _row_max_tokens(config)
    ceiling_setting = routing_settings.MAX_OUTPUT_TOKENS
    ceilings = [c for c in (row, int(ceiling_setting) if ceiling_setting else None) if c]
    wanted = request.max_tokens if request.max_tokens is not None else row
    if wanted is None or not ceilings or wanted <= min(ceilings):
        return request
    return replace(request, max_tokens=min(ceilings))


@dataclass(frozen=True)
class _Setup:
    """What a session reads from the configuration before its walk."""

    plan: Plan
    rows: dict[str, Provider]
    denied: frozenset[str]  # candidates the caller may not use (not_allowed)


def _setup(request: AuditRequest, config: ConfigSnapshot) -> _Setup:
    """What one routed request needs of the configuration, from the in-process snapshot
    (no database read: llm_routing.snapshot)."""
    plan = resolve(request, config)
    return _Setup(plan=plan, rows=config.rows(plan.names), denied=_denied(plan, request, config))


@dataclass(frozen=True, slots=True)
class Setup(Effect[_Setup]):
    """The session's configuration reads (:func:`_setup`) → _Setup."""

    request: AuditRequest

    def run(self, ctx: Context) -> _Setup:
        setup = _setup(self.request, current())
        release_pooled_connections()  # no pooled connection held across upstream calls
        return setup

    async def arun(self, ctx: Context) -> _Setup:
        # The snapshot answers from memory; a due check or rebuild runs off the loop.
        return _setup(self.request, await acurrent())
