"""Wiring for the demo: one question -> a stream of events as the rollout engine produces them.

The page never re-implements the rollout: :class:`DemoRunner` builds the project's
:class:`~r3rag.rollout.engine.RolloutEngine` with the chosen format and the page's settings, and
talks to the retriever through the one the engine uses (the HTTP
:class:`~r3rag.retrieval.client.RetrievalClient` in the real demo).

How steps stream. The engine runs a trajectory in rounds: generate a turn, parse it, retrieve for
it, insert the documents. It yields whole trajectories when they finish, so the runner uses a thin
subclass that reports each step at the two points where a step becomes complete:

- after the engine parsed a turn that ends the trajectory (an answer, a format error, the last
  allowed step), and
- after the engine inserted the documents for a query step (the documents shown are the ones the
  engine kept: de-duplicated and truncated, exactly what the model sees next).

The engine runs as a task and pushes these into a queue; :meth:`DemoRunner.stream` yields them in
order as :class:`StepEvent` s, then one :class:`FinalEvent` with the finished trajectory and, when
the question came from the dataset, its gold answers and metrics. Anything that goes wrong (empty or
too long question, retriever or model down, a failure inside the rollout) arrives as a
:class:`MessageEvent` with one readable sentence, never as an exception.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal, Union

from r3rag.data.records import Question
from r3rag.demo.config import FORMAT_CHOICES, DemoConfig
from r3rag.demo.policies import Policy
from r3rag.errors import R3RagError
from r3rag.metrics import qa_scores
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats.registry import get_format
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.trajectory import Step, Trajectory

START_HINT = "start it with: bash startup/server.sh"


class DemoInputError(R3RagError):
    """The user's question or settings cannot be run (the message says why)."""


@dataclass
class RunSettings:
    """What the page's controls choose for one question."""

    format_name: str = "r3rag_steps"
    max_steps: int = 5
    docs_per_step: int = 3
    temperature: float = 0.0


@dataclass
class StepEvent:
    trajectory: Trajectory
    step: Step


@dataclass
class FinalEvent:
    trajectory: Trajectory
    gold: Question | None
    scores: dict[str, float] | None


@dataclass
class MessageEvent:
    level: Literal["error", "warning", "info"]
    text: str


DemoEvent = Union[StepEvent, FinalEvent, MessageEvent]


def _normalise_question(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


class DemoRunner:
    """Runs questions for the page: input checks, health checks, the engine, gold-answer metrics."""

    def __init__(
        self,
        cfg: DemoConfig,
        policy: Policy,
        retriever: Retriever,
        questions: list[Question] | None = None,
        retriever_label: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.retriever = retriever
        self.questions = list(questions or [])
        self._by_text = {_normalise_question(q.question): q for q in self.questions}
        self.retriever_label = retriever_label or ", ".join(cfg.retrieval.urls)

    # ---- checks ------------------------------------------------------------------------------
    def check_question(self, text: str | None) -> str:
        question = (text or "").strip()
        if not question:
            raise DemoInputError("The question is empty: type a question or pick an example.")
        limit = self.cfg.limits.max_question_chars
        if len(question) > limit:
            raise DemoInputError(f"The question is {len(question)} characters long; the limit is {limit}. Please shorten it.")
        return question

    def check_settings(self, settings: RunSettings) -> RunSettings:
        lim = self.cfg.limits
        try:
            steps, docs, temp = int(settings.max_steps), int(settings.docs_per_step), float(settings.temperature)
        except (TypeError, ValueError):
            raise DemoInputError("Max steps, documents per step and temperature must be numbers.") from None
        if temp != temp:  # NaN
            raise DemoInputError("Temperature must be a number.")
        if settings.format_name not in FORMAT_CHOICES.values():
            known = ", ".join(FORMAT_CHOICES.values())
            raise DemoInputError(f"Unknown format {settings.format_name!r}; choose one of: {known}.")
        if not 1 <= steps <= lim.max_steps:
            raise DemoInputError(f"Max steps must be between 1 and {lim.max_steps}, got {settings.max_steps}.")
        if not 1 <= docs <= lim.max_docs:
            raise DemoInputError(f"Documents per step must be between 1 and {lim.max_docs}, got {settings.docs_per_step}.")
        if not 0.0 <= temp <= lim.max_temperature:
            raise DemoInputError(f"Temperature must be between 0 and {lim.max_temperature}, got {settings.temperature}.")
        return RunSettings(settings.format_name, steps, docs, temp)

    def lookup(self, question: str) -> Question | None:
        """The dataset question with this text (whitespace and case ignored), if any."""
        return self._by_text.get(_normalise_question(question))

    async def retriever_health(self) -> tuple[bool, str]:
        probe = getattr(self.retriever, "ahealth", None)
        if probe is None:
            return True, "in-process retriever"
        try:
            info = await probe()
        except Exception as err:  # noqa: BLE001 - any failure is "down", said in one line
            return False, f"the retrieval service at {self.retriever_label} is not answering ({_one_line(err)}); {START_HINT}"
        indexes = info.get("indexes") if isinstance(info, dict) else None
        detail = f"indexes: {', '.join(indexes)}" if indexes else "up"
        return True, f"retrieval service at {self.retriever_label} is up ({detail})"

    # ---- running -----------------------------------------------------------------------------
    def system_prompt_path(self, format_name: str) -> str | None:
        """The instructions file for ``format_name`` (None: the format's packaged default)."""
        if self.cfg.rollout.system_prompt_path is not None:
            return self.cfg.rollout.system_prompt_path
        choice = self.cfg.prompt
        if choice == "auto":
            p = self.cfg.policy
            choice = "fewshot" if p.backend == "hf" and p.model == "smollm2" else "standard"
        if choice == "standard":
            return None
        path = resources.files("r3rag.templates").joinpath("rollout").joinpath(f"{format_name}_fewshot.txt")
        return str(path) if path.is_file() else None

    def make_engine(self, settings: RunSettings, on_step: Callable[[Trajectory, Step], None]) -> RolloutEngine:
        rollout = self.cfg.rollout.model_copy(
            update={
                "format": settings.format_name,
                "max_steps": settings.max_steps,
                "docs_per_step": settings.docs_per_step,
                "temperature": settings.temperature,
                "temperatures": None,
                "n_samples": 1,
            }
        )
        c = rollout
        fmt = get_format(
            c.format, mode=c.mode, tokenizer=self.policy.tokenizer, observation_role=c.observation_role,
            system_prompt_path=self.system_prompt_path(c.format), raw_prompt_path=c.raw_prompt_path,
        )
        backend = self.policy.backend_for(fmt)
        return RolloutEngine(backend, self.retriever, rollout, fmt, on_step=on_step)

    async def stream(self, text: str | None, settings: RunSettings) -> AsyncIterator[DemoEvent]:
        """Yield the events of one question: steps as they complete, then the final one."""
        try:
            question_text = self.check_question(text)
            settings = self.check_settings(settings)
        except DemoInputError as err:
            yield MessageEvent("error", str(err))
            return
        ok, msg = await self.retriever_health()
        if not ok:
            yield MessageEvent("error", f"Retriever down: {msg}.")
            return
        ok, msg = await self.policy.health()
        if not ok:
            yield MessageEvent("error", f"Model down: {msg}.")
            return
        gold = self.lookup(question_text)
        refusal = self.policy.refusal(gold)
        if refusal is not None:
            yield MessageEvent("error", refusal)
            return
        question = gold or Question(id="user-question", question=question_text, golden_answers=[])
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        try:
            engine = self.make_engine(settings, on_step=lambda t, s: queue.put_nowait(("step", (t, s))))
        except (R3RagError, ValueError) as err:
            yield MessageEvent("error", f"Cannot set up the rollout: {_one_line(err)}")
            return

        async def run() -> None:
            try:
                async for traj in engine.astream([question]):
                    queue.put_nowait(("final", traj))
            except Exception as err:  # noqa: BLE001 - the engine should not raise; if it does, say so
                queue.put_nowait(("crash", err))
            finally:
                queue.put_nowait(("end", None))

        task = asyncio.create_task(run())
        try:
            while True:
                kind, item = await queue.get()
                if kind == "step":
                    yield StepEvent(*item)
                elif kind == "final":
                    for message in explain_stop(item, self.retriever_label):
                        yield message
                    yield FinalEvent(item, gold, self.score(item, gold))
                elif kind == "crash":
                    yield MessageEvent("error", f"The rollout failed: {_one_line(item)}")
                else:
                    break
        finally:
            if not task.done():
                task.cancel()

    def score(self, traj: Trajectory, gold: Question | None) -> dict[str, float] | None:
        if gold is None or not gold.golden_answers:
            return None
        return qa_scores(traj.answer or "", gold.golden_answers, self.cfg.data.normalization)


def explain_stop(traj: Trajectory, retriever_label: str) -> list[MessageEvent]:
    """Readable messages for trajectories that ended because something outside the model failed."""
    out: list[MessageEvent] = []
    if traj.stop_reason == "retrieval_failed":
        why = traj.metadata.get("retrieval_error", "no reason given")
        text = f"Retriever down: the retrieval service at {retriever_label} failed ({why}); {START_HINT}."
        out.append(MessageEvent("error", text))
    model_failed = traj.stop_reason == "backend_error"
    if model_failed:
        why = traj.metadata.get("backend_error", "no reason given")
        out.append(MessageEvent("error", f"Model failed: no output for step {len(traj.steps) + 1} ({why})."))
    last = traj.steps[-1] if traj.steps else None
    if traj.stop_reason == "format_error" and not model_failed and last is not None:
        out.append(MessageEvent("warning", (
            f"Step {last.index + 1} did not follow the {traj.format_name} format ({last.format_error}). "
            "Small untrained models often don't: train one and pass --model, or watch the pipeline with --backend oracle."
        )))
    return out


def save_trajectory(traj: Trajectory, out_dir: str | Path) -> Path:
    """Write one trajectory as indented JSON (the page's download link points at it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", traj.question_id)[:60] or "question"
    path = out / f"trajectory-{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 10**6:06d}.json"
    path.write_text(json.dumps(traj.to_dict(), ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
