"""The LLM judge: OpenAI-compatible client, on-disk cache, strict reply parsing."""

from r3rag.rewards.judge.cache import JudgeCache, request_key
from r3rag.rewards.judge.client import JudgeClient, JudgeConfig, JudgeRequest, JudgeResult, JudgeStats
from r3rag.rewards.judge.parse import parse_score, parse_verdict

__all__ = [
    "JudgeCache",
    "JudgeClient",
    "JudgeConfig",
    "JudgeRequest",
    "JudgeResult",
    "JudgeStats",
    "parse_score",
    "parse_verdict",
    "request_key",
]
