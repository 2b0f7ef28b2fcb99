"""Settings of a cold-start build (``configs/coldstart/*.yaml``, ``--set`` overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from r3rag.config import Section
from r3rag.rewards.answer import AnswerConfig
from r3rag.rewards.judge.client import JudgeConfig
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.oracle import OracleVariety


class DataSection(Section):
    questions: str = Field("runs/world/train.jsonl", description="FlashRAG or R1-Searcher JSONL of training questions")
    limit: int | None = Field(None, ge=1, description="first N questions only")
    shard_index: int = Field(0, ge=0)
    num_shards: int = Field(1, ge=1, description="question i goes to shard i % num_shards")

    @model_validator(mode="after")
    def _check(self) -> "DataSection":
        if self.shard_index >= self.num_shards:
            raise ValueError(f"shard_index {self.shard_index} must be below num_shards {self.num_shards}")
        return self


class RetrieverSection(Section):
    urls: list[str] = Field(default_factory=list, description="retrieval service URLs")
    index_dir: str | None = Field(None, description="search an index in-process instead (no server)")
    timeout_s: float = 30.0
    retries: int = 3


class TeacherSection(Section):
    kind: Literal["oracle", "hf", "openai"] = "oracle"
    model: str = Field("smollm2", description="hf: folder/.gguf/hub name; openai: the served model name")
    base_url: str | None = Field(None, description="openai: the server, e.g. http://127.0.0.1:8000 or http://127.0.0.1:8000/v1")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the key")
    endpoint: Literal["completions", "chat"] = "chat"
    tokenizer: str = Field("smollm2", description="tokenizer of the trajectories (oracle/openai): the student's")
    dtype: str = Field("float32", description="hf: float32 | bfloat16 | auto (r3rag.precision: bfloat16 where native)")
    device: str = "cpu"
    variety: OracleVariety = OracleVariety()


class AttemptsSection(Section):
    max_attempts: int = Field(7, ge=1, description="R3-RAG: up to 7 chains per question")
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.9], description="attempt j uses item j (last repeats)")

    def temperature(self, attempt: int) -> float:
        return self.temperatures[min(attempt, len(self.temperatures) - 1)]


class FilterSection(Section):
    answer: AnswerConfig = AnswerConfig(metric="em", judge_fallback=False)
    judge: JudgeConfig | None = Field(None, description="LLM judge for answers the rule rejects (answer.judge_fallback)")
    on_judge_failure: Literal["reject", "accept", "drop_question"] = Field(
        "reject", description="judge gave no verdict: treat as wrong and try again | keep the chain | drop the question"
    )


class OutputSection(Section):
    dir: str = "runs/coldstart"
    chunk_size: int = Field(32, ge=1, description="questions per resumable unit")
    dataset_prefix: str | None = Field(None, description="dataset names in dataset_info.json (default: the format name)")
    progress: bool = True


class ColdStartConfig(Section):
    data: DataSection = DataSection()
    retriever: RetrieverSection = RetrieverSection()
    teacher: TeacherSection = TeacherSection()
    rollout: RolloutConfig = RolloutConfig(docs_per_step=3, max_steps=5)
    attempts: AttemptsSection = AttemptsSection()
    filter: FilterSection = FilterSection()
    output: OutputSection = OutputSection()
    seed: int = 0
