"""One trajectory on OpenRLHF's vLLM engine: the logic behind the ``AgentExecutor`` plugin.

OpenRLHF calls ``await executor.execute(prompt, label, sampling_params, max_length,
hf_tokenizer, llm_engine)`` once per sample, on the vLLM engine actor's event loop, and expects
the token ids of the whole episode, the ranges the model generated (its ``action_mask``), the
reward and the rollout log-probs. :meth:`AgentRollout.execute` runs the episode with the shared
:class:`~r3rag.rollout.env.RetrievalEnv`, so every rule (format parsing, stop reasons, document
de-duplication, truncation, rendering, token budget) is the one our own engine applies:

1. the question comes from the dataset row: ``prompt`` is the raw question (no chat template on
   OpenRLHF's side: our format renders the prompt) and ``label`` a JSON object
   ``{"id", "golden_answers", "metadata"}`` (train/scripts/openrlhf_prompts.py writes them; a
   plain string is taken as the one gold answer);
2. each model turn is ``await llm_engine.generate(ids, params)`` where ``params`` is OpenRLHF's
   SamplingParams (temperature, top-p, log-probs: the trainer's) plus the format's stop strings,
   kept in the output (``include_stop_str_in_output``), and the turn budget of the env (capped
   by ``max_length``, so OpenRLHF never truncates an episode);
3. :meth:`RetrievalEnv.step` records the turn, retrieves for its query with the async client
   (node-local replica first) and returns the feedback ids, appended as they are;
4. the finished trajectory is scored by the configured reward recipe in a worker thread (a judge
   call never blocks the event loop); ``reward`` is the total, ``r3rag_step_rewards`` one reward
   per action range (placed by :mod:`.per_step` on each step's last token);
5. a sample the recipe drops (the retriever or the engine failed: not the policy's fault) comes
   back with no action ranges and ``r3rag_dropped`` True: it adds nothing to any loss, and the
   per-step hook keeps it out of its group's baseline.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import threading
from typing import Any

from r3rag.data.records import Question
from r3rag.rewards.recipes import RewardScorer, load_recipe
from r3rag.rewards.types import RewardOutput
from r3rag.rollout.backends.base import GenerationOutput
from r3rag.rollout.backends.vllm import completion_to_output
from r3rag.rollout.env import RetrievalEnv
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.formats.registry import get_format
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.trajectory import Trajectory
from r3rag.train.openrlhf.config import AgentConfig, load_agent_config
from r3rag.train.openrlhf.per_step import DROP_KEY, STEP_KEY
from r3rag.train.openrlhf.retrieval import LocalFirstClient, order_urls

#: SamplingParams fields copied from OpenRLHF's params into each turn's params (when present)
_COPIED = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "min_tokens", "logprobs", "skip_special_tokens", "spaces_between_special_tokens",
           "stop_token_ids", "ignore_eos")
#: question metadata the reward recipes read from the trajectory (gold supporting passages)
_REWARD_METADATA = ("supporting_ids", "decomposition")


def parse_label(prompt: str, label: Any) -> Question:
    """The question of a dataset row: ``prompt`` is its text, ``label`` its gold data (see module doc).

    >>> q = parse_label("Who?", '{"id": "q7", "golden_answers": ["Ann"], "metadata": {"supporting_ids": [3]}}')
    >>> (q.id, q.golden_answers, q.metadata["supporting_ids"])
    ('q7', ['Ann'], [3])
    >>> parse_label("Who?", "Ann").golden_answers
    ['Ann']
    """
    data: Any = label
    if isinstance(label, str):
        try:
            data = json.loads(label)
        except ValueError:
            data = label
    if isinstance(data, dict):
        answers = data.get("golden_answers", data.get("answer", []))
        answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
        qid = str(data.get("id", data.get("idx", ""))) or _hash(prompt)
        return Question(qid, prompt, answers, dict(data.get("metadata") or {}))
    answers = [str(a) for a in data] if isinstance(data, list) else ([str(data)] if data not in (None, "") else [])
    return Question(_hash(prompt), prompt, answers)


def _hash(text: str) -> str:
    return "q-" + hashlib.sha1(text.encode()).hexdigest()[:12]


def turn_params(base: Any, max_tokens: int, stop: list[str]) -> Any:
    """A new SamplingParams of ``base``'s class: ``base``'s sampling settings, this turn's budget,
    the format's stop strings kept in the output. ``base`` is never modified."""
    kwargs = {k: getattr(base, k) for k in _COPIED if hasattr(base, k)}
    kwargs.update(max_tokens=max_tokens, stop=list(stop), include_stop_str_in_output=True)
    if kwargs.get("min_tokens", 0) and kwargs["min_tokens"] > max_tokens:
        kwargs["min_tokens"] = max_tokens
    return type(base)(**kwargs)


class AgentRollout:
    """Runs OpenRLHF samples as r3rag episodes. Built without arguments by OpenRLHF (settings from
    the environment, :func:`~.config.load_agent_config`); tests pass ``config``, ``retriever`` and
    ``scorer`` directly."""

    def __init__(
        self,
        config: AgentConfig | None = None,
        retriever: Retriever | None = None,
        scorer: RewardScorer | None = None,
    ) -> None:
        self.config = config or load_agent_config()
        c = self.config
        if retriever is None:
            urls = order_urls(c.retrieval.urls) if c.retrieval.local_first else list(c.retrieval.urls)
            retriever = LocalFirstClient(urls, timeout=c.retrieval.timeout, retries=c.retrieval.retries,
                                         backoff=c.retrieval.backoff, index=c.retrieval.index)
        self.retriever = retriever
        self._scorer = scorer
        self._lock = threading.Lock()
        self._formats: dict[int, TrajectoryFormat] = {}
        self._counter = itertools.count()
        self._component_keys: list[str] | None = None  # set from the recipe on first use

    # ---- lazily built pieces ----------------------------------------------------------------
    @property
    def scorer(self) -> RewardScorer:
        with self._lock:
            if self._scorer is None:
                r = self.config.reward
                self._scorer = load_recipe(r.recipe, r.overrides, recipe_dir=r.recipe_dir)
            return self._scorer

    def format_for(self, tokenizer: Any) -> TrajectoryFormat:
        key = id(tokenizer)
        fmt = self._formats.get(key)
        if fmt is None:
            c = self.config.rollout
            fmt = self._formats[key] = get_format(
                c.format, mode=c.mode, tokenizer=tokenizer, observation_role=c.observation_role,
                system_prompt_path=c.system_prompt_path, raw_prompt_path=c.raw_prompt_path,
                prompt_variant=c.prompt_variant)
        return fmt

    # ---- one sample ---------------------------------------------------------------------------
    async def run_episode(self, question: Question, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                          llm_engine: Any) -> tuple[Trajectory, bool]:
        """Generate one trajectory; returns it and whether the last turn was cut by its budget."""
        fmt = self.format_for(hf_tokenizer)
        rollout = self.config.rollout.model_copy(update={"max_total_tokens": min(self.config.rollout.max_total_tokens, max_length)})
        env = RetrievalEnv(question, fmt, hf_tokenizer, rollout, self.retriever, sample_index=next(self._counter))
        env.trajectory.metadata.update({k: question.metadata[k] for k in _REWARD_METADATA if k in question.metadata})
        eos = getattr(hf_tokenizer, "eos_token_id", None)
        truncated = False
        while not env.done:
            budget = env.turn_budget()
            if budget <= 0:
                await env.step(GenerationOutput([], "", None, "length"))
                truncated = True
                break
            try:
                result = await llm_engine.generate(list(env.ids), turn_params(sampling_params, budget, fmt.stop))
                out = completion_to_output(result.outputs[0], eos)
            except Exception as err:  # noqa: BLE001 - the engine failed: infrastructure, not the policy
                out = GenerationOutput([], "", None, "error", error=f"{type(err).__name__}: {err}")
            truncated = out.finish_reason == "length"
            await env.step(out)
        return env.trajectory, truncated

    async def score(self, traj: Trajectory) -> RewardOutput:
        try:
            return (await asyncio.to_thread(self.scorer.score, [traj]))[0]
        except Exception as err:  # noqa: BLE001 - a scoring bug must not take the rollout down; the sample is dropped
            traj.metadata["reward_error"] = f"{type(err).__name__}: {err}"
            return RewardOutput(0.0, [0.0] * max(1, len(traj.steps)), dropped=True, missing=["reward:error"])

    async def execute(self, prompt: str, label: Any, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any, images: Any = None) -> dict[str, Any]:
        """OpenRLHF's executor contract (``openrlhf.utils.agent.AgentExecutorBase.execute``)."""
        question = parse_label(prompt, label)
        traj, truncated = await self.run_episode(question, sampling_params, max_length, hf_tokenizer, llm_engine)
        reward = await self.score(traj)
        return self.response(prompt, label, images, traj, reward, truncated, want_logprobs=getattr(sampling_params, "logprobs", None) is not None)

    def response(self, prompt: str, label: Any, images: Any, traj: Trajectory, reward: RewardOutput,
                 truncated: bool, want_logprobs: bool) -> dict[str, Any]:
        """The dict OpenRLHF's samples generator reads, plus our two keys (see :mod:`.per_step`)."""
        ids = traj.token_ids
        ranges: list[tuple[int, int]] = []
        logprobs: list[float] | None = [] if want_logprobs else None
        pos = 0
        for seg in traj.segments:
            n = len(seg.token_ids)
            if seg.role == "model":
                ranges.append((pos, pos + n))
            if logprobs is not None:
                lp = seg.logprobs if seg.role == "model" and seg.logprobs and len(seg.logprobs) == n else None
                logprobs.extend(lp if lp is not None else [0.0] * n)
            pos += n
        dropped = bool(reward.dropped)
        step_rewards = list(reward.per_step[: len(ranges)])
        if len(reward.per_step) > len(ranges) and ranges:  # an episode that ended before its last step's tokens
            step_rewards[-1] += sum(reward.per_step[len(ranges):])
        total = float(sum(step_rewards)) if ranges else 0.0
        if dropped:
            ranges, step_rewards, total = [], [], 0.0
        score = total if self.config.agent.score == "total" else float(reward.components.get("correct", total))
        out: dict[str, Any] = {
            "prompt": prompt,
            "label": label,
            "images": images,
            "mm_train_inputs": None,
            "reward": total,
            "scores": score,
            "observation_tokens": ids,
            "action_ranges": ranges,
            "rollout_log_probs": logprobs,
            "truncated": truncated,
            "extra_logs": self.extra_logs(traj, reward),
            DROP_KEY: dropped,
        }
        if self.config.agent.per_step_rewards:
            out[STEP_KEY] = step_rewards
        if self.config.agent.return_trajectory:
            out["r3rag_trajectory"] = traj.to_dict()
        return out

    def component_keys(self) -> list[str]:
        """The recipe components logged for every sample: a function of the recipe alone (the
        experience batches OpenRLHF merges must all carry the same keys, dropped samples too)."""
        if self._component_keys is None:
            cfg = self.scorer.config
            if cfg.shape == "stepwise":
                keys = ["outcome", "process", "format_penalty", "correct", "relevance_mean"]
            else:
                keys = list(dict.fromkeys(t.component for t in cfg.outcome.terms)) + ["format_valid", "format_penalty"]
            self._component_keys = keys
        return self._component_keys

    def extra_logs(self, traj: Trajectory, reward: RewardOutput) -> dict[str, float]:
        """Scalars OpenRLHF logs per sample (the same keys for every sample of a run)."""
        logs = {
            "r3rag/steps": float(len(traj.steps)),
            "r3rag/retrievals": float(traj.num_retrievals),
            "r3rag/answered": float(traj.stop_reason == "answered"),
            "r3rag/format_error": float(traj.stop_reason == "format_error"),
            "r3rag/max_tokens": float(traj.stop_reason == "max_tokens"),
            "r3rag/retrieval_failed": float(traj.stop_reason == "retrieval_failed"),
            "r3rag/dropped": float(reward.dropped),
        }
        for k in self.component_keys():
            logs[f"r3rag/reward/{k}"] = float(reward.components.get(k, 0.0))
        return logs
