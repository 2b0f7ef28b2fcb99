"""The chat template's pieces ("slots"), cut where the rollout cuts a conversation.

SFT and RL must see the same tokens. The rollout renders a conversation with the tokenizer's own
chat template (:mod:`r3rag.rollout.formats.base`): the prompt (system + user + generation cue) is
one environment segment, each model turn ends with the end-of-turn token the model generates
(``eos_text``, e.g. ``<|im_end|>``), and everything after it (the template's newline, the
observation turn with the documents, the next generation cue) is one environment segment.

LLaMA-Factory renders a conversation from *slots* (system, user, assistant, observation), each a
string with ``{{content}}``, tokenised slot by slot; assistant slots are trained on, the others
not. :func:`derive_slots` cuts the tokenizer's chat template into exactly the rollout's pieces by
rendering sentinel messages:

- ``system`` / ``user``: the first prompt, split where the user turn opens (at a special token,
  so tokenising the two halves gives the same ids as the whole);
- ``assistant``: ``{{content}}`` + the end-of-turn token (what the model generates and is trained on);
- ``observation``: what the template writes after the end-of-turn token up to the next
  generation cue, with the documents as ``{{content}}`` (stock chatml slots put the newline after
  ``<|im_end|>`` into the assistant slot instead, so LLaMA-Factory would train on a token the
  rollout treats as environment text; these slots do not).

The *end-of-turn convention* (one for both stages): every assistant turn ends with exactly one
end-of-turn token that is trained on. In the R3-RAG step format the model generates it (the
rollout's mask already has it). In R1-Searcher's tag format a query turn is stopped at
``<|end_of_query|>`` and the environment writes the end-of-turn token (mask 0 in the rollout),
and the final turn stops at ``</answer>`` with none: :func:`sft_view` gives the rollout
trajectory's ids and mask with those end-of-turn tokens added/trained on, which is what
LLaMA-Factory trains on and what the contract test compares against.

This module only needs a Hugging Face tokenizer: it runs in the core environment and in
LLaMA-Factory's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTENT = "{{content}}"
_S = "\u27e6R3S\u27e7"
_U = "\u27e6R3U\u27e7"
_A = "\u27e6R3A\u27e7"
_O = "\u27e6R3O\u27e7"


class SlotError(ValueError):
    """The chat template cannot be cut into rollout-compatible slots."""


@dataclass(frozen=True)
class ChatSlots:
    prefix: str  # text before the system turn that is not part of it (usually empty)
    system: str
    user: str
    assistant: str
    observation: str
    eot: str  # the end-of-turn text closing an assistant turn (trained on)

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def _render(tok: Any, messages: list[dict[str, str]], gen: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def _enc(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False).input_ids)


def _special_strings(tok: Any) -> list[str]:
    out = set(getattr(tok, "all_special_tokens", []) or [])
    for t in (getattr(tok, "added_tokens_decoder", {}) or {}).values():
        out.add(str(getattr(t, "content", t)))
    return sorted((s for s in out if s), key=len, reverse=True)


def _safe_cut(tok: Any, between: str) -> int:
    """A position in ``between`` (text separating two slots) at a special token where tokenising
    the two halves gives the same ids as the whole: the last such position."""
    whole = _enc(tok, between)
    specials = _special_strings(tok)
    best = -1
    for k in range(1, len(between)):
        if any(between.startswith(s, k) for s in specials) and _enc(tok, between[:k]) + _enc(tok, between[k:]) == whole:
            best = k
    if best < 0:
        raise SlotError(f"no token-safe place to split {between!r} between chat turns")
    return best


def derive_slots(tok: Any, observation_role: str = "tool") -> ChatSlots:
    """Cut ``tok``'s chat template into rollout-compatible slots (see the module docstring)."""
    eot = tok.eos_token or ""
    first = _render(tok, [{"role": "system", "content": _S}, {"role": "user", "content": _U}], True)
    i_s, i_u = first.find(_S), first.find(_U)
    if i_s < 0 or i_u < i_s:
        raise SlotError("the chat template drops or reorders the system message")
    between = first[i_s + len(_S): i_u]
    cut = i_s + len(_S) + _safe_cut(tok, between)
    head = first[:i_s]
    system = head + CONTENT + first[i_s + len(_S): cut]
    user = first[cut:i_u] + CONTENT + first[i_u + len(_U):]
    convo = [{"role": "system", "content": _S}, {"role": "user", "content": _U}, {"role": "assistant", "content": _A},
             {"role": observation_role, "content": _O}]
    full = _render(tok, convo, True)
    i_a = full.find(_A)
    if i_a < 0 or not full.startswith(first):
        raise SlotError("the chat template renders the prompt differently once a reply follows")
    after = full[i_a + len(_A):]
    if not eot or not after.startswith(eot):
        raise SlotError(f"the chat template does not close an assistant turn with the EOS token {eot!r}")
    observation = after[len(eot):]
    if _O not in observation:
        raise SlotError(f"the chat template drops {observation_role!r} messages")
    return ChatSlots(prefix="", system=system, user=user, assistant=CONTENT + eot,
                     observation=observation.replace(_O, CONTENT), eot=eot)


def fill(slot: str, content: str) -> str:
    return slot.replace(CONTENT, content, 1)


def render_pieces(slots: ChatSlots, system: str, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """The conversation as ``(text, trained)`` pieces in LLaMA-Factory's order: the first piece is
    system + first user turn, then one piece per message (assistant pieces are trained)."""
    out: list[tuple[str, bool]] = []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            text = fill(slots.user, m["content"])
            if i == 0:
                out.append((slots.prefix + fill(slots.system, system), False))
            out.append((text, False))
        elif m["role"] == "assistant":
            out.append((fill(slots.assistant, m["content"]), True))
        else:
            out.append((fill(slots.observation, m["content"]), False))
    return out


def encode_pieces(tok: Any, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of pieces tokenised one by one (as LLaMA-Factory does)."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in pieces:
        t = _enc(tok, text) if text else []
        ids += t
        mask += [1 if trained else 0] * len(t)
    return ids, mask


def sft_view(traj: Any, eot_ids: list[int]) -> tuple[list[int], list[int]]:
    """The rollout trajectory's ids and loss mask under the end-of-turn convention.

    Every model segment must be followed by the end-of-turn ids, trained on: where the model
    generated them they are already there (mask 1); where the environment wrote them (a turn
    stopped at a stop string) their mask becomes 1; where nothing follows (the last turn stopped
    at a stop string) they are appended.
    """
    ids: list[int] = []
    mask: list[int] = []
    segs = traj.segments
    n = len(eot_ids)
    for k, seg in enumerate(segs):
        seg_ids = list(seg.token_ids)
        seg_mask = [1 if seg.role == "model" else 0] * len(seg_ids)
        if seg.role == "env" and k > 0 and segs[k - 1].role == "model" and n and not _ends_with(segs[k - 1].token_ids, eot_ids):
            if seg_ids[:n] == eot_ids:
                seg_mask[:n] = [1] * n
        ids += seg_ids
        mask += seg_mask
    if segs and segs[-1].role == "model" and n and not _ends_with(segs[-1].token_ids, eot_ids):
        ids += eot_ids
        mask += [1] * n
    return ids, mask


def _ends_with(ids: list[int], tail: list[int]) -> bool:
    return len(ids) >= len(tail) and list(ids[len(ids) - len(tail):]) == list(tail)
