"""Config as code: llm_routing.config_io and the llm_routing_apply/export commands."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError

from llm_routing import config_io
from llm_routing.config_io import ConfigError, apply, export
from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule

pytestmark = pytest.mark.django_db

CANONICAL = (Path(__file__).parent / "data" / "routing.toml").read_text(encoding="utf-8")

# The same configuration as CANONICAL, written the way a person might: other order,
# defaults spelled out, integers for floats, entries as tables, no header.
HANDWRITTEN = """
version = 1

[rules.legacy]
chain = "default"
route = "old"
task_glob = "translate-*"
enabled = false
priority = 20

[rules.images]
chain = "vision"
route = "vision"
priority = 5

[rules.cheap-summaries]
task_glob = "summar*"
priority = 20
chain = "cheap"

[chains.vision]
description = ""
entries = [{ provider = "openai-main", model = "gpt-4o" }, { provider = "anthropic" }]

[chains.default]
is_default = true
description = "Production chain.\\nOpenAI first, Anthropic as the fallback."
entries = [
  { provider = "openai-main", enabled = true },
  { provider = "anthropic", model = "claude-haiku-4-5" },
  { provider = "gemini-flash", enabled = false },
]

[chains.cheap]
description = "Offline first: the local model, then the mock."
entries = ["local-llama", "mock"]

[providers.mock]
kind = "mock"
model = "mock-1"
timeout_s = 30

[providers.openai-main]
supports_streaming = true
supports_structured_output = true
kind = "openai"
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"
enabled = true

[providers.local-llama]
kind = "openai_compatible"
model = "llama-3.1-8b-instruct"
base_url = "http://127.0.0.1:8081/v1"
api_key_env = "LOCAL_LLAMA_KEY"
mode = "mock"
max_retries = 0

[providers.local-llama.params]
top_p = 0.9
extra_body = { seed = 7, repetition_penalty = 1.1 }
stop = ["</s>", "###"]

[providers.gemini-flash]
kind = "gemini"
model = "gemini-2.5-flash"
api_key_env = "GEMINI_API_KEY"
enabled = false

[providers.anthropic]
kind = "anthropic"
model = "claude-sonnet-4-5"
api_key_env = "ANTHROPIC_API_KEY"
timeout_s = 45.5
first_token_timeout_s = 7.25
max_retries = 1
supports_structured_output = true
supports_streaming = true
supports_prefill = true
params = { temperature = 0.0, max_tokens = 1024 }
"""


def counts() -> tuple[int, int, int, int]:
    return (
        Provider.objects.count(),
        Chain.objects.count(),
        ChainEntry.objects.count(),
        RoutingRule.objects.count(),
    )


# --- round trip ------------------------------------------------------------------------


def test_apply_then_export_is_byte_for_byte_identical() -> None:
    changes = apply(CANONICAL)
    assert len(changes) == 5 + 3 + 3  # providers, chains, rules created
    assert all(c.action == "+" for c in changes)
    assert export() == CANONICAL
    assert apply(CANONICAL) == []  # apply → export → apply is a no-op
    assert export() == CANONICAL


def test_handwritten_file_exports_in_canonical_form() -> None:
    apply(HANDWRITTEN)
    assert export() == CANONICAL
    assert apply(HANDWRITTEN) == []


def test_rows_hold_what_the_file_says() -> None:
    apply(CANONICAL)
    llama = Provider.objects.get(name="local-llama")
    assert llama.params == {
        "extra_body": {"repetition_penalty": 1.1, "seed": 7},
        "stop": ["</s>", "###"],
        "top_p": 0.9,
    }
    assert (llama.mode, llama.max_retries, llama.base_url) == (
        "mock",
        0,
        "http://127.0.0.1:8081/v1",
    )
    anthropic = Provider.objects.get(name="anthropic")
    assert (anthropic.timeout_s, anthropic.first_token_timeout_s) == (45.5, 7.25)
    default = Chain.objects.get(is_default=True)
    entries = list(
        default.entries.order_by("position").values_list("provider__name", "model", "enabled")
    )
    assert entries == [
        ("openai-main", "", True),
        ("anthropic", "claude-haiku-4-5", True),
        ("gemini-flash", "", False),
    ]
    rule = RoutingRule.objects.get(name="legacy")
    assert (rule.priority, rule.enabled, rule.route, rule.task_glob, rule.chain.name) == (
        20,
        False,
        "old",
        "translate-*",
        "default",
    )


def test_export_of_admin_made_rows_round_trips() -> None:
    p = Provider.objects.create(name="b", kind="mock", params={"z": 1, "a": {"y": [1, 2.5]}})
    q = Provider.objects.create(name="a", kind="openai", api_key_env="A_KEY", timeout_s=12)
    chain = Chain.objects.create(name="c", description='quotes " and \\ back', is_default=True)
    ChainEntry.objects.create(chain=chain, provider=p, position=30)
    ChainEntry.objects.create(chain=chain, provider=q, position=10, model="m2")
    RoutingRule.objects.create(name="r", priority=-3, route="x", chain=chain)
    first = export()
    assert first.index("[providers.a]") < first.index("[providers.b]")
    # Positions are not part of the format, only the order: a → b.
    assert first.index('provider = "a"') < first.index('"b"')
    assert apply(first) == []
    # Into an empty database, the export rebuilds the same state (positions renumbered).
    RoutingRule.objects.all().delete()
    ChainEntry.objects.all().delete()
    Chain.objects.all().delete()
    Provider.objects.all().delete()
    assert len(apply(first)) == 4
    assert export() == first


# --- diff, dry run, prune ------------------------------------------------------------


def test_changes_are_listed_and_dry_run_writes_nothing() -> None:
    apply(CANONICAL)
    edited = CANONICAL.replace('model = "gpt-4o-mini"', 'model = "gpt-4.1-mini"').replace(
        '    "local-llama",\n    "mock",', '    "mock",\n    "local-llama",'
    )
    planned = apply(edited, dry_run=True)
    assert [str(c) for c in planned] == [
        '~ provider openai-main: model "gpt-4o-mini" -> "gpt-4.1-mini"',
        "~ chain cheap: entries [local-llama, mock] -> [mock, local-llama]",
    ]
    assert Provider.objects.get(name="openai-main").model == "gpt-4o-mini"
    assert apply(edited) == planned
    assert Provider.objects.get(name="openai-main").model == "gpt-4.1-mini"
    cheap = Chain.objects.get(name="cheap")
    assert list(cheap.entries.order_by("position").values_list("provider__name", flat=True)) == [
        "mock",
        "local-llama",
    ]
    assert apply(edited) == []


def test_rows_outside_the_file_are_kept_unless_pruned() -> None:
    extra = Provider.objects.create(name="old-vendor", kind="mock")
    old_chain = Chain.objects.create(name="old-chain")
    ChainEntry.objects.create(chain=old_chain, provider=extra, position=0)
    RoutingRule.objects.create(name="old-rule", route="old-route", chain=old_chain)
    apply(CANONICAL)
    assert Provider.objects.filter(name="old-vendor").exists()
    assert export() != CANONICAL

    planned = apply(CANONICAL, prune=True, dry_run=True)
    assert [str(c) for c in planned] == [
        "- rule old-rule",
        "- chain old-chain",
        "- provider old-vendor",
    ]
    assert RoutingRule.objects.filter(name="old-rule").exists()
    apply(CANONICAL, prune=True)
    assert not Provider.objects.filter(name="old-vendor").exists()
    assert not Chain.objects.filter(name="old-chain").exists()
    assert export() == CANONICAL


def test_prune_retargets_a_kept_rule_before_removing_its_old_chain() -> None:
    old_chain = Chain.objects.create(name="old-chain")
    RoutingRule.objects.create(name="images", route="vision", chain=old_chain, priority=5)
    apply(CANONICAL, prune=True)
    assert RoutingRule.objects.get(name="images").chain.name == "vision"
    assert export() == CANONICAL


def test_a_default_chain_in_the_file_takes_over_the_default() -> None:
    Chain.objects.create(name="previous", is_default=True)
    changes = [str(c) for c in apply(CANONICAL)]
    assert "~ chain previous: is_default true -> false" in changes
    assert Chain.objects.get(is_default=True).name == "default"


# --- validation before writing -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[providers.x\nkind=", "Not valid TOML"),
        ("version = 2", "version: only format version 1"),
        ("colour = 1", "unknown top-level key(s) colour"),
        ('[providers.x]\nkind = "no-such-kind"', "providers.x.kind: Unknown provider kind"),
        ('[providers.x]\nkind = "mock"\ncolour = 1', "providers.x: unknown field(s) colour"),
        (
            '[providers.x]\nkind = "mock"\ntimeout_s = "fast"',
            "providers.x.timeout_s: expected a number",
        ),
        ('[providers.x]\nkind = "mock"\ntimeout_s = 0', "providers.x: Constraint"),
        (
            '[providers.x]\nkind = "mock"\nmax_retries = true',
            "providers.x.max_retries: expected an integer",
        ),
        (
            '[providers.x]\nkind = "mock"\nenabled = "yes"',
            "providers.x.enabled: expected true or false",
        ),
        ('[providers.x]\nkind = "mock"\nbase_url = "ftp://h/"', "providers.x.base_url"),
        (
            '[providers.x]\nkind = "mock"\napi_key_env = "DATABASE_URL"',
            "may not be used as a provider key",
        ),
        ('[providers."bad name"]\nkind = "mock"', "providers.bad name: names are"),
        ('[chains.c]\nentries = ["ghost"]', "chains.c.entries[0]: unknown provider 'ghost'"),
        ("[chains.c]\nentries = [1]", "chains.c.entries[0]: expected a provider name"),
        ('[providers.x]\nkind="mock"\n[chains.c]\nentries = ["x", "x"]', "appears twice"),
        ("[chains.a]\nis_default = true\n[chains.b]\nis_default = true", "at most one chain"),
        ('[rules.r]\nroute = "x"\nchain = "nope"', "rules.r.chain: unknown chain 'nope'"),
        ('[rules.r]\nroute = "x"', "rules.r.chain: required"),
        ('[chains.c]\n[rules.r]\nchain = "c"', "rules.r: A rule needs a route key"),
    ],
)
def test_invalid_files_are_refused_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        apply(text)
    assert any(message in e for e in excinfo.value.errors), excinfo.value.errors
    assert counts() == (0, 0, 0, 0)


def test_one_bad_row_means_nothing_is_written() -> None:
    bad = CANONICAL + '\n[rules.broken]\npriority = 1\nroute = "x"\nchain = "missing"\n'
    with pytest.raises(ConfigError):
        apply(bad)
    assert counts() == (0, 0, 0, 0)


def test_every_error_is_reported_at_once() -> None:
    text = '[providers.a]\nkind = "nope"\n[providers.b]\nkind = "mock"\nmax_retries = 99\n'
    with pytest.raises(ConfigError) as excinfo:
        apply(text)
    joined = "\n".join(excinfo.value.errors)
    assert "providers.a.kind" in joined and "providers.b" in joined


def test_writes_happen_in_one_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    real_create = ChainEntry.objects.create
    calls = {"n": 0}

    def failing_create(**kwargs: object) -> ChainEntry:
        calls["n"] += 1
        if calls["n"] == 3:
            raise IntegrityError("simulated concurrent edit")
        return real_create(**kwargs)

    monkeypatch.setattr(ChainEntry.objects, "create", failing_create)
    with pytest.raises(ConfigError, match="database refused the change"):
        apply(CANONICAL)
    assert counts() == (0, 0, 0, 0)  # providers and chains written before were rolled back


# --- no keys in the file -----------------------------------------------------------


FAKE_KEY = "sk-proj-AbCdEf0123456789GhIjKl"


@pytest.mark.parametrize(
    "text",
    [
        f'[providers.x]\nkind = "openai"\napi_key = "{FAKE_KEY}"',
        '[providers.x]\nkind = "openai"\napi_key = "anything"',
        '[providers.x]\nkind = "openai"\n[providers.x.params]\nAuthorization = "Bearer abc"',
        '[providers.x]\nkind = "openai"\nparams = { headers = { "x-api-key" = "v" } }',
        f'[providers.x]\nkind = "openai"\napi_key_env = "{FAKE_KEY}"',
        f'[providers.x]\nkind = "openai"\nmodel = "{FAKE_KEY}"',
        '[providers.x]\nkind = "gemini"\nbase_url = "https://h/?key=AIzaSyA0123456789abcdefghijklmnopqrstu"',
        f'[chains.c]\ndescription = "uses {FAKE_KEY}"',
        f'secret = "{FAKE_KEY}"',
    ],
)
def test_key_values_are_refused_and_never_echoed(text: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        apply(text)
    message = "\n".join(excinfo.value.errors)
    assert "key" in message.lower()
    assert FAKE_KEY not in message and "AIzaSy" not in message and "Bearer abc" not in message
    assert counts() == (0, 0, 0, 0)


def test_ordinary_names_are_not_mistaken_for_keys() -> None:
    text = (
        '[providers.sk-learn]\nkind = "mock"\nmodel = "sk-learn-pipeline-small"\n'
        "params = { max_tokens = 10, top_k = 3 }\n"
        '[chains.secret-project]\nentries = ["sk-learn"]\n'
    )
    assert len(apply(text)) == 2


def test_export_refuses_values_toml_cannot_hold() -> None:
    Provider.objects.create(name="x", kind="mock", params={"stop": None})
    with pytest.raises(ConfigError, match=r"providers.x.params.stop: null"):
        export()


# --- commands ------------------------------------------------------------------------


def test_apply_command_prints_the_diff(tmp_path: Path) -> None:
    path = tmp_path / "routing.toml"
    path.write_text(CANONICAL, encoding="utf-8")
    out = io.StringIO()
    call_command("llm_routing_apply", str(path), "--dry-run", stdout=out, no_color=True)
    assert "+ provider openai-main" in out.getvalue()
    assert "11 row(s) would change." in out.getvalue()
    assert counts() == (0, 0, 0, 0)
    out = io.StringIO()
    call_command("llm_routing_apply", str(path), stdout=out, no_color=True)
    assert "11 row(s) changed." in out.getvalue()
    out = io.StringIO()
    call_command("llm_routing_apply", str(path), "--prune", stdout=out, no_color=True)
    assert "No changes" in out.getvalue()


def test_apply_command_errors(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("llm_routing_apply", str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text('[providers.x]\nkind = "nope"\n', encoding="utf-8")
    with pytest.raises(CommandError, match=r"nothing was changed\.\n  providers\.x\.kind"):
        call_command("llm_routing_apply", str(bad))


def test_export_command_writes_the_file(tmp_path: Path) -> None:
    apply(CANONICAL)
    out = io.StringIO()
    call_command("llm_routing_export", stdout=out)
    assert out.getvalue() == CANONICAL
    target = tmp_path / "exported.toml"
    call_command("llm_routing_export", "-o", str(target))
    assert target.read_bytes() == CANONICAL.encode("utf-8")


def test_every_model_field_is_carried_by_the_format() -> None:
    """A field added to a configuration model travels in the file without code changes."""
    provider_fields = {f.name for f in config_io._scalar_fields(Provider)}
    assert {"kind", "model", "api_key_env", "params", "supports_prefill"} <= provider_fields
    assert {f.name for f in config_io._scalar_fields(ChainEntry)} >= {"model", "enabled"}


# --- on the real PostgreSQL ------------------------------------------------------------


@pytest.mark.services
def test_round_trip_on_postgresql(tmp_path: Path) -> None:
    """jsonb reorders object keys and PostgreSQL has its own float and text handling:
    the byte-for-byte round trip must hold there too (subprocess, own database)."""
    import os
    import subprocess
    import sys

    import psycopg
    from psycopg import sql

    admin_url = os.environ.get("LLMR_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    # One database per run, so concurrent runs on a shared server never collide.
    db_name = os.environ.get("LLMR_CONFIG_IO_DB", f"llm_routing_config_io_{os.getpid()}")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(db_name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db_name)))
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEBUG": "true",
        "DATABASE_URL": admin_url.rsplit("/", 1)[0] + "/" + db_name,
    }
    for name in ("LLM_PROVIDER_CHAIN", "LLM_PROVIDER", "LLM_ROUTING_RULES"):
        env.pop(name, None)

    def manage(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    try:
        manage("migrate", "--noinput", "-v", "0")
        source = tmp_path / "routing.toml"
        source.write_text(HANDWRITTEN, encoding="utf-8")
        assert "11 row(s) changed." in manage("llm_routing_apply", str(source))
        assert manage("llm_routing_export") == CANONICAL
        source.write_text(CANONICAL, encoding="utf-8")
        assert "No changes" in manage("llm_routing_apply", str(source), "--prune")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db_name))
            )


def test_apply_command_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO(CANONICAL))
    out = io.StringIO()
    call_command("llm_routing_apply", "-", stdout=out, no_color=True)
    assert "11 row(s) changed." in out.getvalue()
    assert export() == CANONICAL


def test_empty_database_exports_an_empty_config_that_prunes_everything() -> None:
    assert export().endswith("version = 1\n")
    apply(CANONICAL)
    empty = "version = 1\n"
    assert len(apply(empty)) == 0  # without --prune, nothing outside the file is touched
    apply(empty, prune=True)
    assert counts() == (0, 0, 0, 0)
