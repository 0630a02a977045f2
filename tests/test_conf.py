"""LLM_ROUTING settings: defaults, override_settings reload, unknown keys rejected."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from llm_routing.conf import DEFAULTS, RoutingSettings, routing_settings


def test_defaults():
    s = RoutingSettings({})
    assert s.MAX_INPUT_CHARS == 100_000
    assert s.DEFAULT_CHAIN == []
    assert s.CACHE_ALIAS == "default"
    assert set(DEFAULTS) >= {"MAX_INSTRUCTIONS_CHARS", "API_PERMISSION_CLASSES", "ROUTES"}


def test_override_settings_reloads():
    before = routing_settings.MAX_INPUT_CHARS
    with override_settings(LLM_ROUTING={"MAX_INPUT_CHARS": 7}):
        assert routing_settings.MAX_INPUT_CHARS == 7
    assert routing_settings.MAX_INPUT_CHARS == before


def test_unknown_key_is_rejected_with_its_name():
    with override_settings(LLM_ROUTING={"MAX_INPUT_CHRS": 5}):
        with pytest.raises(ImproperlyConfigured, match="MAX_INPUT_CHRS"):
            _ = routing_settings.MAX_INPUT_CHARS


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        _ = routing_settings.NOT_A_SETTING


def test_non_dict_setting_is_rejected():
    with override_settings(LLM_ROUTING=["x"]):
        with pytest.raises(ImproperlyConfigured, match="must be a dict"):
            _ = routing_settings.MAX_INPUT_CHARS


def test_system_check_reports_unknown_and_malformed_keys():
    from llm_routing.checks import check_settings

    with override_settings(LLM_ROUTING={"BOGUS": 1, "DEFAULT_CHAIN": "a,b", "MAX_ATTEMPTS": 0}):
        ids = [m.id for m in check_settings()]
        messages = " ".join(m.msg for m in check_settings())
    assert ids.count("llm_routing.E001") == 1
    assert ids.count("llm_routing.E002") == 2
    assert "BOGUS" in messages and "DEFAULT_CHAIN" in messages and "MAX_ATTEMPTS" in messages
    with override_settings(LLM_ROUTING={}):
        assert check_settings() == []
