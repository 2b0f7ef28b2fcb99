"""Token helpers: the only places the rollout turns text into ids and back.

Generated text is never re-tokenised: model segments keep the ids the backend sampled and their
text is ``decode(ids)``. Only text the environment writes (the prompt and the feedback) is
encoded, once, with no special tokens added (a chat template already contains them) and with
``clean_up_tokenization_spaces`` off so that decoding gives back the exact text.
"""

from __future__ import annotations

from typing import Any


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def truncate_text_to_tokens(tokenizer: Any, text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` whose encoding has at most ``max_tokens`` tokens (approx.:
    decodes the first ``max_tokens`` ids, so it never splits a multi-byte character)."""
    ids = encode(tokenizer, text)
    if len(ids) <= max_tokens:
        return text
    out = decode(tokenizer, ids[:max_tokens])
    return out.rstrip("\ufffd")


def segment_mask_report(tokenizer: Any, trajectory: Any) -> dict[str, Any]:
    """Check a trajectory's token invariants; returns what a test asserts on.

    - ``text_matches``: decoding all ids gives the concatenated segment text;
    - ``env_text``: the text of exactly the tokens whose loss-mask is 0 after the prompt.
    """
    ids = trajectory.token_ids
    mask = trajectory.loss_mask
    n_prompt = sum(len(s.token_ids) for s in trajectory.segments if s.role == "prompt")
    env_ids = [t for t, m in zip(ids[n_prompt:], mask[n_prompt:]) if m == 0]
    return {
        "text_matches": decode(tokenizer, ids) == trajectory.text,
        "env_text": decode(tokenizer, env_ids),
        "model_text": decode(tokenizer, [t for t, m in zip(ids, mask) if m == 1]),
    }
