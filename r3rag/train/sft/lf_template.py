"""Register r3rag's chat template inside LLaMA-Factory's process (imported only there).

:func:`register_r3rag_template` loads the model's tokenizer, cuts its chat template into the
rollout's slots (:func:`r3rag.train.sft.chat_slots.derive_slots`) and registers them with
LLaMA-Factory under ``name`` (default ``r3rag``), so the YAML's ``template: r3rag`` trains on the
rollout's tokens and mask. The tokenizer's own Jinja template is kept (``replace_jinja_template``
off), so the saved checkpoint renders prompts exactly as the rollout does.
"""

from __future__ import annotations

from typing import Any

from r3rag.train.sft.chat_slots import ChatSlots, derive_slots

TEMPLATE_NAME = "r3rag"


def register_slots(slots: ChatSlots, name: str = TEMPLATE_NAME) -> None:
    from llamafactory.data.formatter import EmptyFormatter, StringFormatter
    from llamafactory.data.template import TEMPLATES, register_template

    TEMPLATES.pop(name, None)  # re-registration in one process (tests) replaces it
    register_template(
        name=name,
        format_user=StringFormatter(slots=[slots.user]),
        format_assistant=StringFormatter(slots=[slots.assistant]),
        format_system=StringFormatter(slots=[slots.system]),
        format_observation=StringFormatter(slots=[slots.observation]),
        format_prefix=EmptyFormatter(slots=[slots.prefix]) if slots.prefix else None,
        stop_words=[slots.eot],
        efficient_eos=False,
        replace_eos=False,
        replace_jinja_template=False,
    )


def register_r3rag_template(tokenizer_path: str, name: str = TEMPLATE_NAME, observation_role: str = "tool") -> ChatSlots:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(tokenizer_path)
    slots = derive_slots(tok, observation_role=observation_role)
    register_slots(slots, name)
    return slots
