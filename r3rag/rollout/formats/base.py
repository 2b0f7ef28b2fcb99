"""The contract every trajectory format fulfils.

A *format* decides what the policy sees and writes: how a question becomes a prompt, which stop
strings end a model turn, how a finished turn is parsed into ``(analysis, query | answer)``, how
retrieved documents are rendered back as environment feedback, and what counts as a format error.
The engine only talks to this interface, so a new format is one subclass registered by name
(see :mod:`r3rag.rollout.formats.registry`).

Two modes exist for every format:

- ``chat``: the prompt is rendered with the tokenizer's chat template (system + user); each model
  turn is one assistant message and the documents come back as a separate observation message
  (role ``observation_role``, ``"tool"`` by default), rendered by the same chat template. This is
  exactly how LLaMA-Factory's sharegpt data renders ``gpt``/``observation`` turns, so SFT data and
  RL rollouts see the same text (:meth:`TrajectoryFormat.feedback_text` computes the template's
  text between the end of the assistant content and the start of the next assistant content).
- ``raw``: plain completion for base models; the documents are inserted inline.

Feedback *overlap*: a model turn may already end with the beginning of the feedback text (the
EOS token that closes a chat turn, or the ``The retrieval documents:`` marker it was stopped at).
The environment then appends only the rest, so the concatenated text is exactly the rendered
conversation and no sampled token is ever dropped or re-tokenised.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from r3rag.data.records import Passage
from r3rag.rollout.formats.rules import FormatConfig, Violation, strip_end

Mode = Literal["chat", "raw"]

# Errors a parser can report (Step.format_error holds one of these names).
FORMAT_ERRORS: tuple[str, ...] = (
    "no_marker",  # neither a query nor an answer
    "unterminated_tag",  # an opening tag without its closing tag
    "query_and_answer",  # both in one turn
    "empty_query",
    "empty_answer",
    "repetition",  # runaway repetition
    "truncated",  # the turn hit its token budget before a query or an answer
)

_SENTINEL_A = "\u27e6R3RAG-ASSISTANT\u27e7"
_SENTINEL_O = "\u27e6R3RAG-OBSERVATION\u27e7"


@dataclass
class ParsedTurn:
    """One model turn, parsed. Exactly one of ``query``/``answer`` is set unless ``error`` is."""

    analysis: str = ""
    query: str | None = None
    answer: str | None = None
    error: str | None = None


PROMPT_VARIANTS = ("standard", "fewshot")


def load_template(name: str, path: str | Path | None = None) -> str:
    """Read a prompt template: ``path`` if given (a user's own file), else the packaged one."""
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    return resources.files("r3rag.templates").joinpath("rollout", name).read_text(encoding="utf-8")


def has_runaway_repetition(text: str, min_unit: int = 8, min_repeats: int = 6) -> bool:
    """True when some chunk of ``min_unit``+ characters repeats back to back ``min_repeats`` times.

    Cheap check on the tail of a turn: degenerate sampling loops (the same phrase over and over)
    are the common case; legitimate steps never repeat a long chunk six times in a row.
    """
    tail = text[-2000:]
    pattern = re.compile(r"(.{%d,200}?)\1{%d,}" % (min_unit, min_repeats - 1), re.DOTALL)
    return pattern.search(tail) is not None


def longest_overlap(text: str, feedback: str) -> int:
    """Largest k such that ``text`` ends with ``feedback[:k]``."""
    for k in range(min(len(text), len(feedback)), 0, -1):
        if text.endswith(feedback[:k]):
            return k
    return 0


class TrajectoryFormat(ABC):
    """Base class: subclasses set ``name``, the templates, and implement the abstract methods.

    ``tokenizer`` is only needed in chat mode (for its chat template); raw mode renders plain text.
    """

    name: str = ""
    #: per-mode stop strings that end a model turn (kept in the output)
    chat_stop: tuple[str, ...] = ()
    raw_stop: tuple[str, ...] = ()
    system_template: str = ""
    raw_template: str = ""
    #: text that opens every documents block (readers such as the oracle count these)
    documents_marker: str = ""

    def __init__(
        self,
        mode: Mode = "chat",
        tokenizer: Any = None,
        observation_role: str = "tool",
        system_prompt_path: str | Path | None = None,
        raw_prompt_path: str | Path | None = None,
        prompt_variant: str = "standard",
    ) -> None:
        """``prompt_variant`` picks the packaged instructions: ``standard`` (``<name>_system.txt``,
        for trained checkpoints) or ``fewshot`` (``<name>_fewshot.txt``: the same plus a worked
        example, which an untrained small model needs to follow the format). A user's
        ``system_prompt_path`` wins over both."""
        if mode not in ("chat", "raw"):
            raise ValueError(f"mode must be 'chat' or 'raw', got {mode!r}")
        self.mode: Mode = mode
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        if prompt_variant not in PROMPT_VARIANTS:
            raise ValueError(f"prompt_variant must be one of {PROMPT_VARIANTS}, got {prompt_variant!r}")
        template = self.system_template
        if prompt_variant != "standard":
            template = template.replace("_system.txt", f"_{prompt_variant}.txt")
        self.system_prompt = load_template(template, system_prompt_path).strip()
        self.raw_prompt = load_template(self.raw_template, raw_prompt_path)
        if mode == "chat" and (tokenizer is None or not getattr(tokenizer, "chat_template", None)):
            raise ValueError(f"format {self.name!r} in chat mode needs a tokenizer with a chat template")

    # ---- prompt ------------------------------------------------------------------------------
    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.user_message(question)},
        ]

    def user_message(self, question: str) -> str:
        return f"The question: {question}"

    def render_prompt(self, question: str) -> str:
        """The text the policy sees before its first turn."""
        if self.mode == "chat":
            return self._chat(self.prompt_messages(question), add_generation_prompt=True)
        return self.raw_prompt.format(instructions=self.system_prompt, question=question)

    # ---- turn ---------------------------------------------------------------------------------
    @property
    def stop(self) -> list[str]:
        """Stop strings that end a model turn (the backend keeps them in the output)."""
        return list(self.chat_stop if self.mode == "chat" else self.raw_stop)

    @abstractmethod
    def parse_turn(self, text: str, step_index: int) -> ParsedTurn:
        """Parse one model turn (its text exactly as generated)."""

    @abstractmethod
    def render_turn(self, step_index: int, analysis: str, query: str | None = None, answer: str | None = None) -> str:
        """The text a well-behaved policy writes for one turn (the oracle and teachers use it),
        including the stop string that ends it (chat answers end with the tokenizer's EOS)."""

    @abstractmethod
    def render_documents(self, documents: list[Passage], step_index: int) -> str:
        """The documents as the body of the environment's feedback."""

    # ---- feedback -----------------------------------------------------------------------------
    def feedback_text(self, turn_text: str, documents: list[Passage], step_index: int) -> str:
        """What the environment appends after ``turn_text``: the rendered documents plus whatever
        the mode needs around them (closing the assistant turn, the observation turn, the next
        generation prompt), minus any prefix the turn already ends with."""
        body = self.render_documents(documents, step_index)
        if self.mode == "chat":
            full = self._chat_feedback(body)
        else:
            full = self.raw_feedback(body)
        return full[longest_overlap(turn_text, full):]

    def raw_feedback(self, body: str) -> str:
        return body

    def _chat_feedback(self, body: str) -> str:
        msgs = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _SENTINEL_A},
            {"role": self.observation_role, "content": _SENTINEL_O},
        ]
        rendered = self._chat(msgs, add_generation_prompt=True)
        start = rendered.index(_SENTINEL_A) + len(_SENTINEL_A)
        return rendered[start:].replace(_SENTINEL_O, body)

    def _chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    @property
    def eos_text(self) -> str:
        tok = self.tokenizer
        return tok.eos_token if tok is not None and tok.eos_token else ""

    # ---- conversation view (SFT export) ---------------------------------------------------------
    def conversation(self, question: str, turns: list[tuple[str, str | None]]) -> list[dict[str, str]]:
        """Chat messages for a trajectory: ``turns`` is ``[(model_text, documents_body | None)]``.

        Applying the tokenizer's chat template to these messages reproduces the rollout text (with
        the model's trailing EOS moved into the template's end-of-turn marker), which is what the
        SFT exporter writes as sharegpt ``gpt``/``observation`` turns.
        """
        msgs = self.prompt_messages(question)
        eos = self.eos_text
        for model_text, docs in turns:
            content = model_text[: -len(eos)] if eos and model_text.endswith(eos) else model_text
            msgs.append({"role": "assistant", "content": content})
            if docs is not None:
                msgs.append({"role": self.observation_role, "content": docs})
        return msgs

    def trajectory_messages(self, traj: Any) -> list[dict[str, str]]:
        """:meth:`conversation` for a finished :class:`~r3rag.rollout.trajectory.Trajectory`:
        one assistant message per model segment, one observation per documents insertion."""
        turns: list[tuple[str, str | None]] = []
        steps = iter(s for s in traj.steps)
        for seg in traj.segments:
            if seg.role == "model":
                turns.append((seg.text, None))
            elif seg.role == "env" and turns:
                step = next((st for st in steps if st.query is not None), None)
                docs = self.render_documents(step.documents, step.index) if step is not None else ""
                turns[-1] = (turns[-1][0], docs)
        return self.conversation(traj.question, turns)

    # ---- format rules (rewards) ---------------------------------------------------------------
    @classmethod
    def format_violations(cls, traj: Any, cfg: FormatConfig) -> list[Violation]:
        """The named rules ``traj`` (a trajectory in this format) breaks, read from the model's own
        text; the rewards' format checks call this. A format without rules cannot be scored for
        format and says so."""
        raise ValueError(f"format {cls.name!r} declares no format rules (override format_violations)")

    # ---- shared helpers -----------------------------------------------------------------------
    def _strip_end(self, text: str) -> str:
        """The turn without trailing EOS text and whitespace (:func:`~r3rag.rollout.formats.rules.strip_end`)."""
        return strip_end(text, [self.eos_text] if self.eos_text else [])
