"""The agent plugin's settings: one YAML file plus environment variables.

OpenRLHF builds ``AgentExecutor()`` with no arguments, once per vLLM engine actor, so the launch
script hands the settings over through the environment:

``R3RAG_AGENT_CONFIG``
    a YAML path, or the name of a config packaged beside this module
    (``configs/<name>.yaml``: ``r3rag_ppo``, ``r1searcher_stage1``, ``r1searcher_stage2``);
``R3RAG_AGENT_SET``
    dotted overrides separated by ``;`` or newlines (``rollout.docs_per_step=2;reward.recipe=r3rag``);
``R3RAG_RETRIEVER_URLS``
    comma-separated retrieval service URLs (one replica per node). Wins over ``retrieval.urls``.

Unknown keys and bad values are one-line :class:`~r3rag.errors.ConfigError` messages.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Mapping

from pydantic import Field

from r3rag.config import Section, load_config
from r3rag.errors import ConfigError
from r3rag.rollout.config import RolloutConfig

PACKAGED = Path(__file__).with_name("configs")
ENV_CONFIG, ENV_SET, ENV_URLS = "R3RAG_AGENT_CONFIG", "R3RAG_AGENT_SET", "R3RAG_RETRIEVER_URLS"


def default_recipe_dir() -> str:
    """``configs/rewards`` of the checkout r3rag runs from (absolute: Ray workers have another cwd)."""
    return str(Path(__file__).resolve().parents[3] / "configs" / "rewards")


class RetrievalSection(Section):
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8100"],
                            description="retrieval service replicas; the node-local one is tried first")
    local_first: bool = Field(True, description="move URLs whose host is this machine to the front")
    timeout: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=0, description="retries (on the next URL) before the step fails")
    backoff: float = Field(0.2, ge=0)
    index: str | None = Field(None, description="index name, when the service serves several")


class RewardSection(Section):
    recipe: str = Field("r3rag", description="recipe name in recipe_dir, or a YAML path")
    overrides: list[str] = Field(default_factory=list, description="dotted overrides of the recipe")
    recipe_dir: str = Field(default_factory=default_recipe_dir)


class AgentSection(Section):
    per_step_rewards: bool = Field(
        True, description="send each step's reward to the trainer hook (r3rag.train.openrlhf.per_step); "
        "False: only the total, which stock OpenRLHF puts on the last token")
    score: Literal["total", "correct"] = Field("total", description="what OpenRLHF's `scores` (dynamic filtering) gets")
    return_trajectory: bool = Field(False, description="attach the whole trajectory dict to each sample (debugging)")


class AgentConfig(Section):
    rollout: RolloutConfig = RolloutConfig()
    retrieval: RetrievalSection = RetrievalSection()
    reward: RewardSection = RewardSection()
    agent: AgentSection = AgentSection()


def resolve_config_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = PACKAGED / f"{name_or_path}.yaml"
    if packaged.is_file():
        return packaged
    known = ", ".join(sorted(p.stem for p in PACKAGED.glob("*.yaml")))
    raise ConfigError(f"{ENV_CONFIG}={name_or_path}: no such file and no packaged config of that name (packaged: {known})")


def split_overrides(text: str) -> list[str]:
    """``"a=1; b=2\\nc=3"`` -> ``["a=1", "b=2", "c=3"]`` (empty items dropped).

    >>> split_overrides("rollout.max_steps=5; reward.recipe=r3rag\\n")
    ['rollout.max_steps=5', 'reward.recipe=r3rag']
    """
    return [item.strip() for line in text.splitlines() for item in line.split(";") if item.strip()]


def load_agent_config(environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The plugin's config from the environment (see the module docstring)."""
    env = os.environ if environ is None else environ
    path = resolve_config_path(env[ENV_CONFIG]) if env.get(ENV_CONFIG) else None
    overrides = split_overrides(env.get(ENV_SET, ""))
    cfg = load_config(AgentConfig, path, overrides)
    urls = [u.strip() for u in env.get(ENV_URLS, "").split(",") if u.strip()]
    if urls:
        cfg.retrieval.urls = urls
    return cfg
