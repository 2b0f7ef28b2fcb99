"""Backends by name: ``get_backend("hf" | "openai" | "vllm" | "vllm_async", **kwargs)``.

``hf`` takes ``model`` (folder, hub name, ``.gguf`` file or ``smollm2``), ``dtype``, ``device``;
``openai`` takes ``base_url``, ``model``, ``tokenizer``, ``endpoint``; ``vllm*`` take ``model``.
"""

from __future__ import annotations

from typing import Any, Callable

from r3rag.errors import ConfigError
from r3rag.rollout.backends.base import PolicyBackend


def _hf(model: str, **kw: Any) -> PolicyBackend:
    from r3rag.rollout.backends.hf import HFBackend

    return HFBackend.from_pretrained(model, **kw)


def _openai(**kw: Any) -> PolicyBackend:
    from r3rag.rollout.backends.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(**kw)


def _vllm(**kw: Any) -> PolicyBackend:
    from r3rag.rollout.backends.vllm import VLLMBackend

    return VLLMBackend(**kw)


def _vllm_async(**kw: Any) -> PolicyBackend:
    from r3rag.rollout.backends.vllm import AsyncVLLMBackend

    return AsyncVLLMBackend(**kw)


BACKENDS: dict[str, Callable[..., PolicyBackend]] = {
    "hf": _hf,
    "openai": _openai,
    "vllm": _vllm,
    "vllm_async": _vllm_async,
}


def get_backend(name: str, **kwargs: Any) -> PolicyBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown policy backend {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return factory(**kwargs)
