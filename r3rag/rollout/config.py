"""Settings of the rollout engine (``rollout:`` section of a YAML config).

``profile: PATH`` names a rollout profile (:mod:`r3rag.rollout.profile`): its budgets fill every
budget key the section does not set, so the stages that share a profile share their budgets.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from r3rag.config import Section


class TreeConfig(Section):
    """Step-level tree rollouts (:mod:`r3rag.rollout.tree`): ``roots`` chains per question, then at
    each step boundary in ``at_steps`` every chain that went on past it gets ``branch - 1`` new
    continuations from its prefix (the boundary ``s``: after step ``s - 1``'s documents)."""

    roots: int = Field(2, ge=1, description="independent chains per question (the root's children)")
    branch: int = Field(2, ge=2, description="continuations at each branching point, the original included")
    at_steps: list[int] = Field(default_factory=lambda: [1], description="step boundaries to branch at (1 = after the first step's documents)")

    @model_validator(mode="after")
    def _check(self) -> "TreeConfig":
        if not self.at_steps or any(s < 1 for s in self.at_steps) or sorted(set(self.at_steps)) != self.at_steps:
            raise ValueError("at_steps: give increasing step boundaries, each at least 1")
        return self


class RolloutConfig(Section):
    profile: str | None = Field(None, description="rollout profile (configs/rollout/*.yaml) whose budgets fill the keys not set here")
    format: str = Field("r3rag_steps", description="trajectory format name (r3rag_steps | r1searcher_tags | ...)")
    mode: Literal["chat", "raw"] = "chat"
    observation_role: str = Field("tool", description="chat role of the documents turn (rendered by the chat template)")
    system_prompt_path: str | None = Field(None, description="replace the packaged instructions with this file")
    raw_prompt_path: str | None = Field(None, description="replace the packaged raw-mode prompt with this file")
    prompt_variant: Literal["standard", "fewshot"] = Field(
        "standard", description="packaged instructions: standard (trained models) or fewshot (adds a worked example)"
    )

    n_samples: int = Field(1, ge=1)
    max_steps: int = Field(5, ge=1, description="model turns per trajectory")
    docs_per_step: int = Field(5, ge=0, description="new documents inserted per query")
    max_docs_per_trajectory: int | None = Field(None, ge=0)
    dedupe_docs: bool = Field(True, description="skip passages already shown in this trajectory")
    max_retrieval_k: int = Field(50, ge=1, description="cap on k asked from the retriever when de-duplicating")
    doc_max_chars: int | None = Field(512, ge=1)
    doc_max_tokens: int | None = Field(None, ge=1)

    max_turn_tokens: int = Field(256, ge=1, description="tokens one model turn may generate")
    max_new_tokens: int = Field(1024, ge=1, description="tokens a trajectory may generate in all")
    max_total_tokens: int = Field(4096, ge=1, description="context length cap: prompt + model + documents")

    temperature: float = Field(0.0, ge=0.0)
    temperatures: list[float] | None = Field(None, description="per-sample temperatures (sample j uses item j, last repeats)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    tree: TreeConfig | None = Field(None, description="step-level tree rollouts for RL (roots, branch, at_steps); "
                                    "None: n_samples independent chains")

    @model_validator(mode="before")
    @classmethod
    def _fill_from_profile(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("profile"):
            from r3rag.rollout.profile import load_profile

            data = {**load_profile(data["profile"]).model_dump(), **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        if self.temperatures is not None and not self.temperatures:
            raise ValueError("temperatures: give at least one value or leave it unset")
        return self

    def temperature_for(self, sample_index: int) -> float:
        if self.temperatures:
            return self.temperatures[min(sample_index, len(self.temperatures) - 1)]
        return self.temperature
