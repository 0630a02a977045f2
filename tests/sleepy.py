"""A provider kind that answers like the mock, but only after ``params["sleep_s"]``
seconds — a stand-in for a slow upstream, so a test can kill a worker mid-task."""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

from llm_routing.providers.mock import MockProvider
from llm_routing.types import AuditRequest, ProviderResult

__all__ = ["SleepyProvider"]


class SleepyProvider(MockProvider):
    kind: ClassVar[str] = "sleepy"
    result_mode: ClassVar[str] = "live"

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        time.sleep(float(self.config.params.get("sleep_s", 1.0)))
        result = super().complete(request, api_key=api_key, timeout=timeout)
        return dataclasses.replace(result, provider=self.config.name, mode="live")
