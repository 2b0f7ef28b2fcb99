"""Rollout profiles: one set of budgets for every stage that rolls out the same model.

A chain the cold-start teacher writes is what SFT trains on and what RL and evaluation later ask
the student to write again. When the stages have their own budgets they drift apart: a teacher
turn longer than the RL turn budget is text the policy can never produce, and a chain longer than
the SFT cutoff is cut by LLaMA-Factory in the middle of a documents turn. A *profile* is a small
YAML file (``configs/rollout/*.yaml``) holding the budgets once:

- ``max_steps``, ``docs_per_step``, ``max_docs_per_trajectory``: turns and documents;
- ``doc_max_chars``, ``doc_max_tokens``: how long one document may be;
- ``max_turn_tokens``, ``max_new_tokens``, ``max_total_tokens``: what one turn, one trajectory's
  turns together, and the whole context (prompt + turns + documents) may hold.

A ``rollout:`` section names it with ``profile: PATH``; the profile's values fill every key the
section does not set itself (a ``--set rollout.max_turn_tokens=16`` still wins, e.g. in a test).
SFT reads the same file: its cutoff defaults to :meth:`RolloutProfile.sft_cutoff_len`, so no
chain a rollout with this profile can produce is ever cut. The quickstart passes one profile to
every stage.

A relative path is looked up from the working folder, then from the repository root.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from r3rag.config import Section, read_yaml
from r3rag.errors import ConfigError

#: tokens the SFT view may add to a rollout trajectory: the end-of-turn token(s) written after a
#: final turn that stopped at a stop string (R1-Searcher's ``</answer>``; r3rag.train.sft.chat_slots)
SFT_END_ROOM = 16

REPO_ROOT = Path(__file__).resolve().parents[2]


class RolloutProfile(Section):
    max_steps: int = Field(ge=1, description="model turns per trajectory")
    docs_per_step: int = Field(ge=0, description="new documents inserted per query")
    max_docs_per_trajectory: int | None = Field(None, ge=0)
    doc_max_chars: int | None = Field(None, ge=1)
    doc_max_tokens: int | None = Field(None, ge=1)
    max_turn_tokens: int = Field(ge=1, description="tokens one model turn may generate")
    max_new_tokens: int = Field(ge=1, description="tokens a trajectory may generate in all")
    max_total_tokens: int = Field(ge=1, description="context cap: prompt + model turns + documents")

    def sft_cutoff_len(self) -> int:
        """The SFT cutoff under which no trajectory of this profile is cut: the total budget plus
        the end-of-turn tokens the SFT view may append (:data:`SFT_END_ROOM`)."""
        return self.max_total_tokens + SFT_END_ROOM

    def overrides(self, prefix: str = "rollout") -> list[str]:
        """The profile as ``--set`` items, e.g. ``rollout.max_steps=5``."""
        return [f"{prefix}.{k}={'null' if v is None else v}" for k, v in self.model_dump().items()]


PROFILE_KEYS = tuple(RolloutProfile.model_fields)


def profile_path(path: str | Path) -> Path:
    """``path`` as given when it exists (absolute, or relative to the working folder), else relative
    to the repository root; a missing file is a :class:`ConfigError`."""
    p = Path(path)
    for candidate in (p, REPO_ROOT / p):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"rollout profile {path}: file not found (looked in {Path.cwd()} and {REPO_ROOT})")


def load_profile(path: str | Path) -> RolloutProfile:
    p = profile_path(path)
    try:
        return RolloutProfile.model_validate(read_yaml(p))
    except ValidationError as err:
        e = err.errors()[0]
        key = ".".join(str(x) for x in e["loc"])
        raise ConfigError(f"{p}: {key}: {e['msg']}") from None
