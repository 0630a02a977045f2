"""A minimal OpenAI-format adapter kind for the load bench (``bench_openai``).

The real vendor adapters are built in other branches; this one speaks just enough of
``POST {base_url}/chat/completions`` over a pooled httpx client to put a real HTTP
hop (to the bench's local fake upstream) behind each routed request.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import httpx

from llm_routing.errors import NetworkError, ProviderTimeoutError, ResponseError, UnavailableError
from llm_routing.providers.base import BaseProvider
from llm_routing.types import AuditRequest, ProviderConfig, ProviderResult, Usage

__all__ = ["BenchOpenAIProvider"]


class BenchOpenAIProvider(BaseProvider):
    kind: ClassVar[str] = "bench_openai"
    requires_key: ClassVar[bool] = True

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        self._client = httpx.Client(
            base_url=config.base_url,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        started = time.perf_counter()
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": request.instructions or request.task},
                {"role": "user", "content": request.input_text},
            ],
        }
        try:
            response = self._client.post(
                "/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {api_key}"},
                timeout=timeout,
            )
        except httpx.TimeoutException:
            raise ProviderTimeoutError() from None
        except httpx.TransportError:
            raise NetworkError() from None
        if response.status_code >= 500:
            raise UnavailableError(http_status=response.status_code)
        try:
            data = response.json()
            text = data["choices"][0]["message"]["content"]
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError):
            raise ResponseError("Unparsable upstream body.") from None
        return ProviderResult(
            provider=self.config.name,
            model=self.config.model,
            mode="live",
            status="ok",
            output=str(text),
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens", 0)),
                output_tokens=int(usage.get("completion_tokens", 0)),
            ),
            latency_ms=(time.perf_counter() - started) * 1000,
            finish_reason="stop",
        )

    def close(self) -> None:
        self._client.close()
