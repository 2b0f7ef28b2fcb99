"""Build cold-start SFT data: R3-RAG's attempt policy with a correctness filter.

For every training question (this shard's, in input order, in chunks of ``output.chunk_size``):

1. attempt ``a = 0, 1, ...`` up to ``attempts.max_attempts``: the teacher writes a whole chain
   through the rollout engine (the format's prompt, real retrieval, ``rollout.docs_per_step``
   documents per query) at temperature ``attempts.temperature(a)`` (R3-RAG: 0 first, then 0.9),
   every still-open question of the chunk in one batched engine run per attempt;
2. each chain is classified: ``retrieval_failed`` / ``teacher_error`` (infrastructure),
   ``no_answer`` (stopped without an answer), then correct by rule (``filter.answer``:
   exact match by default), else, with ``filter.answer.judge_fallback``, by the LLM judge; a judge
   without a verdict follows ``filter.on_judge_failure``;
3. the first correct chain is kept and the question is closed; a question with no correct chain
   after the last attempt is dropped, counted under the reason of its last attempt.

A kept chain must also render, through LLaMA-Factory's slots, to exactly the rollout's tokens and
mask (:func:`r3rag.train.sft.export.rendering_matches`; checked when the ids are exact);
otherwise that attempt counts as ``render_mismatch``.

Outputs (see :mod:`r3rag.train.coldstart.store` for the resumable layout): our trajectory JSONL
(token-exact, with the attempt, its temperature and the verdict in ``metadata.coldstart``),
LLaMA-Factory sharegpt, R3-RAG's alpaca-per-step, one decision per question, and
``dataset_info.json`` registering both datasets; ``summary.json`` sums up every shard present.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from r3rag.config import dump_config
from r3rag.data.records import Question
from r3rag.errors import ConfigError, R3RagError
from r3rag.rewards.answer import answer_score
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats.registry import get_format
from r3rag.rollout.trajectory import Trajectory
from r3rag.train.coldstart.config import ColdStartConfig
from r3rag.train.coldstart.store import ChunkStore, read_rows
from r3rag.train.coldstart.teachers import build_teacher, load_retriever, probe_retriever, probe_teacher
from r3rag.train.sft.chat_slots import SlotError, derive_slots
from r3rag.train.sft.export import rendering_matches, to_alpaca_steps, to_sharegpt, write_dataset_info

INFRA = ("retrieval_failed", "teacher_error")


class ColdStartError(R3RagError):
    """A cold-start build cannot start or continue (bad folder, unreachable teacher or retriever)."""


def classify(traj: Trajectory) -> str | None:
    """The outcome a chain has before correctness is judged, or None when it has an answer."""
    if traj.stop_reason in ("retrieval_failed",):
        return "retrieval_failed"
    if traj.stop_reason == "backend_error" or any((s.format_error or "").startswith("backend_error") for s in traj.steps):
        return "teacher_error"
    if traj.answer is None or not traj.answer.strip():
        return "no_answer"
    return None


def _shard(questions: list[Question], cfg: ColdStartConfig) -> list[Question]:
    d = cfg.data
    return [q for i, q in enumerate(questions) if i % d.num_shards == d.shard_index]


class ColdStartBuilder:
    def __init__(self, cfg: ColdStartConfig, questions: list[Question]) -> None:
        self.cfg = cfg
        self.questions = _shard(questions, cfg)
        self.out = Path(cfg.output.dir)
        self.backend, self.tokenizer = build_teacher(cfg.teacher, questions, cfg.rollout)
        if cfg.teacher.kind == "hf":  # a model loaded here: its precision beside the data it wrote
            from r3rag.precision import choose_precision

            choose_precision(cfg.teacher.dtype, cfg.teacher.device).write(self.out, "coldstart teacher")
        r = cfg.rollout
        self.fmt = get_format(r.format, mode=r.mode, tokenizer=self.tokenizer, observation_role=r.observation_role,
                              system_prompt_path=r.system_prompt_path, raw_prompt_path=r.raw_prompt_path,
                              prompt_variant=r.prompt_variant)
        if r.mode != "chat":
            raise ConfigError("cold start exports chat conversations: set rollout.mode=chat")
        try:
            self.slots = derive_slots(self.tokenizer, observation_role=r.observation_role)
        except SlotError as err:
            raise ConfigError(f"teacher tokenizer: {err}") from None
        self.retriever = load_retriever(cfg.retriever)
        self.judge = None
        if cfg.filter.answer.judge_fallback:
            if cfg.filter.judge is None:
                raise ConfigError("filter.answer.judge_fallback needs a filter.judge section (base_url, model)")
            from r3rag.rewards.judge.client import JudgeClient

            self.judge = JudgeClient(cfg.filter.judge)

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._check_folder()
        store = ChunkStore(self.out, self.cfg.data.shard_index, self.cfg.data.num_shards)
        write_dataset_info_atomic(self.out, self.cfg.output.dataset_prefix or self.fmt.name)
        size = self.cfg.output.chunk_size
        chunks = [self.questions[i:i + size] for i in range(0, len(self.questions), size)]
        todo = [c for c in range(len(chunks)) if c not in store.done_chunks]
        if todo:
            asyncio.run(self._run_chunks(chunks, todo, store))
        summary = summarize(self.out)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return summary

    def _check_folder(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        saved = self.out / "config.yaml"
        mine = dump_config(self.cfg.model_copy(update={"output": self.cfg.output.model_copy(update={"progress": True})},
                                               deep=True))
        key = _data_key(mine)
        if saved.is_file():
            if _data_key(saved.read_text(encoding="utf-8")) != key:
                raise ColdStartError(f"{self.out}: built with another config ({saved}); use a new output.dir")
        else:
            saved.write_text(mine, encoding="utf-8")

    async def _run_chunks(self, chunks: list[list[Question]], todo: list[int], store: ChunkStore) -> None:
        await probe_retriever(self.retriever)
        await probe_teacher(self.backend, self.cfg.teacher)
        bar = _progress(self.cfg.output.progress, total=len(self.questions),
                        initial=sum(len(chunks[c]) for c in store.done_chunks if c < len(chunks)))
        kept_total = 0
        try:
            for c in todo:
                t0 = time.perf_counter()
                rows = await self._chunk(c, chunks[c])
                store.write_chunk(c, rows, time.perf_counter() - t0)
                if bar is not None:
                    bar.update(len(chunks[c]))
                    kept_total += len(rows["trajectories"])
                    bar.set_postfix(kept=kept_total, refresh=False)
        finally:
            if bar is not None:
                bar.close()
            close = getattr(self.retriever, "aclose", None)
            if close is not None:
                await close()

    async def _chunk(self, chunk_index: int, questions: list[Question]) -> dict[str, list[dict[str, Any]]]:
        cfg = self.cfg
        open_qs = list(questions)
        kept: dict[str, tuple[Trajectory, int, str]] = {}
        last_reason: dict[str, str] = {}
        attempts_of: dict[str, int] = {}
        outcomes: dict[str, list[str]] = {q.id: [] for q in questions}
        for a in range(cfg.attempts.max_attempts):
            if not open_qs:
                break
            temp = cfg.attempts.temperature(a)
            rcfg = cfg.rollout.model_copy(update={"temperature": temp, "temperatures": None, "n_samples": 1,
                                                  "seed": (cfg.seed * 1_000_003 + chunk_index * 7919 + a) % (2**31)})
            engine = RolloutEngine(self.backend, self.retriever, rcfg, fmt=self.fmt)
            trajs = await engine.arun(open_qs)
            verdicts = await self._verdicts(trajs)
            still: list[Question] = []
            for q, t, (outcome, source) in zip(open_qs, trajs, verdicts):
                attempts_of[q.id] = a + 1
                if outcome == "correct" and not self._renders(t):
                    outcome = "render_mismatch"
                outcomes[q.id].append(outcome)
                if outcome == "correct":
                    t.metadata["coldstart"] = {"attempt": a, "temperature": temp, "verdict": source}
                    kept[q.id] = (t, a, source)
                elif outcome == "judge_failed" and cfg.filter.on_judge_failure == "drop_question":
                    last_reason[q.id] = outcome
                else:
                    last_reason[q.id] = outcome
                    still.append(q)
            open_qs = still
        rows: dict[str, list[dict[str, Any]]] = {"trajectories": [], "sharegpt": [], "alpaca_steps": [], "decisions": []}
        for q in questions:
            decision: dict[str, Any] = {"id": q.id, "attempts": attempts_of.get(q.id, 0), "outcomes": outcomes[q.id],
                                        "hops": q.metadata.get("hops")}
            if q.id in kept:
                t, a, source = kept[q.id]
                rows["trajectories"].append(t.to_dict())
                rows["sharegpt"].append(to_sharegpt(t, self.fmt))
                rows["alpaca_steps"].extend(to_alpaca_steps(t, self.fmt))
                c = t.counts
                decision.update(kept=True, verdict=source, steps=c["steps"], retrievals=c["retrievals"],
                                prompt_tokens=c["prompt_tokens"], generated_tokens=c["generated_tokens"],
                                env_tokens=c["env_tokens"])
            else:
                decision.update(kept=False, reason=last_reason.get(q.id, "not_tried"))
            rows["decisions"].append(decision)
        return rows

    def _renders(self, t: Trajectory) -> bool:
        if t.metadata.get("exact_ids") is False:
            return True  # text-only teacher: the sharegpt text is what SFT uses; nothing to compare
        return rendering_matches(t, self.fmt, self.slots, self.tokenizer)

    async def _verdicts(self, trajs: list[Trajectory]) -> list[tuple[str, str]]:
        """``(outcome, source)`` per chain: outcome correct | wrong_answer | judge_failed | an
        infrastructure or no-answer reason; source rule | judge | ''."""
        fc = self.cfg.filter
        out: list[tuple[str, str]] = []
        ask: list[int] = []
        for t in trajs:
            pre = classify(t)
            if pre is not None:
                out.append((pre, ""))
                continue
            score = answer_score(t.answer, t.golden_answers, fc.answer)
            if score >= fc.answer.correct_threshold:
                out.append(("correct", "rule"))
            else:
                out.append(("wrong_answer", "rule"))
                if self.judge is not None:
                    ask.append(len(out) - 1)
        if ask and self.judge is not None:
            reqs = [self.judge.correctness_request(trajs[i].question, trajs[i].answer or "", trajs[i].golden_answers) for i in ask]
            for i, res in zip(ask, await self.judge.ajudge(reqs)):
                if res.value is None:
                    out[i] = ("correct", "judge_failed_accepted") if fc.on_judge_failure == "accept" else ("judge_failed", "judge")
                else:
                    out[i] = ("correct" if res.value >= 0.5 else "wrong_answer", "judge")
        return out


def _data_key(config_yaml: str) -> str:
    """The config minus settings that do not change the data (progress bar, where the folder is,
    where the rollout profile file is: its values are in the rollout section)."""
    import yaml

    data = yaml.safe_load(config_yaml) or {}
    data.get("output", {}).pop("progress", None)
    data.get("output", {}).pop("dir", None)
    data.get("rollout", {}).pop("profile", None)
    return json.dumps(data, sort_keys=True)


def _progress(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="cold start", unit="q")


def write_dataset_info_atomic(out: Path, prefix: str) -> None:
    tmp = out / f".dataset_info.{os.getpid()}.tmp"
    write_dataset_info(out, prefix, path=tmp)
    os.replace(tmp, out / "dataset_info.json")


def summarize(out: str | Path) -> dict[str, Any]:
    """Questions tried, kept, dropped by reason, attempts per kept chain, steps, retrievals, tokens
    (with the longest chain's)."""
    decisions = read_rows(out, "decisions")
    state_elapsed = 0.0
    for p in sorted((Path(out) / "state").glob("part-*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                state_elapsed += float(json.loads(line).get("elapsed_s", 0.0))
    kept = [d for d in decisions if d.get("kept")]
    n = len(decisions)

    def mean(key: str, rows: list[dict[str, Any]]) -> float:
        return round(sum(r.get(key, 0) for r in rows) / len(rows), 3) if rows else 0.0

    by_hops: dict[str, dict[str, float]] = {}
    for h in sorted({d.get("hops") for d in decisions if d.get("hops") is not None}):
        tried = [d for d in decisions if d.get("hops") == h]
        k = [d for d in tried if d.get("kept")]
        by_hops[str(h)] = {"tried": len(tried), "kept": len(k), "retrievals_per_chain": mean("retrievals", k)}
    attempts_total = sum(d.get("attempts", 0) for d in decisions)
    return {
        "tried": n,
        "kept": len(kept),
        "yield": round(len(kept) / n, 4) if n else 0.0,
        "dropped": dict(sorted(Counter(d.get("reason", "?") for d in decisions if not d.get("kept")).items())),
        "attempts_per_kept": dict(sorted(Counter(str(d["attempts"]) for d in kept).items(), key=lambda kv: int(kv[0]))),
        "mean_attempts_per_kept": mean("attempts", kept),
        "attempts_total": attempts_total,
        "verdicts": dict(Counter(d.get("verdict") for d in kept)),
        "steps_per_chain": mean("steps", kept),
        "retrievals_per_chain": mean("retrievals", kept),
        "by_hops": by_hops,
        "tokens": {
            "prompt": sum(d.get("prompt_tokens", 0) for d in kept),
            "generated": sum(d.get("generated_tokens", 0) for d in kept),
            "documents": sum(d.get("env_tokens", 0) for d in kept),
            # the longest kept chain (prompt + turns + documents): SFT's cutoff must be at least this
            "longest_chain": max((d.get("prompt_tokens", 0) + d.get("generated_tokens", 0) + d.get("env_tokens", 0)
                                  for d in kept), default=0),
        },
        "elapsed_s": round(state_elapsed, 2),
        "kept_per_s": round(len(kept) / state_elapsed, 2) if state_elapsed else None,
        "chains_per_s": round(attempts_total / state_elapsed, 2) if state_elapsed else None,
    }


def build_coldstart(cfg: ColdStartConfig) -> dict[str, Any]:
    from r3rag.data.readers import read_questions

    path = Path(cfg.data.questions)
    if not path.is_file():
        raise ConfigError(f"data.questions: {path} not found (build the world: data/build_world.py --out runs/world)")
    questions = read_questions(path, limit=cfg.data.limit)
    if not questions:
        raise ColdStartError(f"{path}: no questions")
    return ColdStartBuilder(cfg, questions).run()
