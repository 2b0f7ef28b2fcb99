"""Policy backends behind one interface (:class:`PolicyBackend`): HF, vLLM, OpenAI-compatible."""

from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend, SamplingParams
from r3rag.rollout.backends.registry import BACKENDS, get_backend

__all__ = ["BACKENDS", "GenerationOutput", "GenerationRequest", "PolicyBackend", "SamplingParams", "get_backend"]
