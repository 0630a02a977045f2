"""Any server speaking the OpenAI Chat Completions wire format at ``base_url``.

vLLM, Ollama (``http://localhost:11434/v1``), LM Studio, llama.cpp server, OpenRouter,
Groq, Together … The ``base_url`` includes the version prefix (``…/v1``) and is
required. A key is optional: local servers usually need none, so a row without
``api_key_env`` is not skipped as ``missing_key``; a row that names a variable needs
it set.

A ``developer`` turn is sent as ``system``: vLLM, Ollama, llama.cpp and LM Studio
reject or ignore the newer role, and a system turn means the same to them.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import InvalidRequestError
from ..types import AuditRequest
from .openai import OpenAIProvider

__all__ = ["OpenAICompatibleProvider"]


class OpenAICompatibleProvider(OpenAIProvider):
    kind: ClassVar[str] = "openai_compatible"
    default_base_url: ClassVar[str] = ""
    # vLLM, Ollama, llama.cpp … know ``max_tokens``; not all know the newer key.
    max_tokens_key: ClassVar[str] = "max_tokens"
    # Servers differ: streaming and tools are near-universal (vLLM, Ollama, llama.cpp,
    # LM Studio); structured output and images are declared per row.
    # Embeddings: vLLM, Ollama, llama.cpp, LM Studio, TEI … serve ``/embeddings``.
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "tools", "embeddings", "token_inputs"}
    )
    # Many local servers reject (or silently drop) the newer ``developer`` role.
    developer_role: ClassVar[str] = "system"

    @property
    def requires_key(self) -> bool:  # type: ignore[override]
        return bool(self.config.api_key_env)

    def endpoint(self, request: AuditRequest) -> str:
        if not self.base_url:
            raise InvalidRequestError("An openai_compatible provider needs a base_url.")
        return super().endpoint(request)
