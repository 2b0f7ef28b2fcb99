"""The single-machine RL loop: rollout -> rewards -> advantages -> clipped update -> checkpoint.

One iteration ``it`` (0-based; ``step = it + 1`` iterations are done after it):

1. **rollout** with the current weights: the trainer and the HF backend share one model object,
   so ``backend.update_weights(None)`` only drops the backend's KV caches; sampling seeds are fresh
   each iteration (``engine.arun(..., seed=base + it)``); the questions are the next slice of a
   seeded per-epoch permutation of the training split (the data order is a function of
   ``(seed, it)``, so a resumed run draws exactly the questions the killed one would have);
2. **rewards** from the configured recipe (:mod:`r3rag.rewards`); per-step rewards go on each
   step's last generated token; dropped / untrainable trajectories, with ``overlong_filtering``
   those the budget cut off, and all-same groups are left out and counted
   (:func:`r3rag.train.rl.batch.select`);
3. **forward without gradient**: the policy's log-probs of the generated tokens (the "old"
   log-probs of the ratio; the rollout's own are kept only for the mismatch metric), the frozen
   reference's (only when ``kl_coef > 0``) and the critic's values (``gae``). Without a reference,
   the rows of the first optimizer step take their old log-probs from their own update forward
   (the weights have not moved yet), so with one step per batch the policy's pass is skipped;
4. **advantages** by the named estimator (:mod:`.estimators`), over the whole batch;
5. **update**: ``epochs_per_batch`` passes; each pass shuffles the rows into optimizer steps of
   ``train_batch_size`` trajectories (default: one step over the whole batch, OpenRLHF's
   ``--train_batch_size``); a step accumulates gradients over micro-batches cut by
   ``micro_batch_tokens`` (every loss is divided by the step's generated tokens, so the sum is the
   token mean), clips the gradient norm and steps the optimizer(s); the scheduler steps once per
   iteration;
6. metrics, held-out evaluation every ``eval_every`` iterations, checkpoint every
   ``checkpoint_every`` iterations (and after the last one).

The forward/backward passes run under ``torch.autocast`` in bfloat16 when ``compute_dtype``
resolves to it (weights and optimizer state stay float32).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from r3rag.config import dump_config
from r3rag.data.records import Question
from r3rag.errors import ConfigError
from r3rag.precision import Precision, choose_precision
from r3rag.rewards.process import gold_recall
from r3rag.rewards.types import RewardOutput, summarize
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.trajectory import Trajectory
from r3rag.rollout.tree import own_generated_tokens
from r3rag.train.rl import evaluate as ev
from r3rag.train.rl.batch import TRUNCATED, RolloutBatch, build_batch, micro_batches, optimizer_steps, select
from r3rag.train.rl.checkpoint import (latest_checkpoint, load_checkpoint, read_state, save_checkpoint, save_hf_folder,
                                       strip_quantizer)
from r3rag.train.rl.config import RLConfig
from r3rag.train.rl.estimators import GROUP_ESTIMATORS, compute_advantages
from r3rag.train.rl.forward import policy_logprobs
from r3rag.train.rl.freeze import freeze_lower_layers
from r3rag.train.rl.guessable import drop_guessable
from r3rag.train.rl.losses import approx_kl, kl_loss, policy_loss, value_loss
from r3rag.train.rl.metrics import MetricsLog
from r3rag.train.rl.value_head import ValueModel

RewardFn = Callable[[Sequence[Trajectory]], list[RewardOutput]]
DONE = "DONE"


def rft_selection(a: Any) -> dict[str, Any]:
    """:func:`select`'s rejection-sampling arguments for ``algo.estimator: rft`` (none otherwise)."""
    if a.estimator != "rft":
        return {}

    def accept(t: Trajectory, r: RewardOutput) -> bool:
        if a.rft_correct_only:
            if "correct" not in r.components:
                raise ConfigError("algo.rft_correct_only needs a reward recipe with a 'correct' component "
                                  "(r3rag does; set algo.rft_correct_only=false and algo.rft_min_reward otherwise)")
            if r.components["correct"] < 1.0:
                return False
        if a.rft_min_recall is not None:
            recall = gold_recall(t)
            if recall is None:
                raise ConfigError(f"algo.rft_min_recall needs questions with gold supporting passages; {t.question_id} has none")
            if recall < a.rft_min_recall - 1e-9:
                return False
        return a.rft_min_reward is None or r.total >= a.rft_min_reward

    return {"top_k": a.rft_top_k, "accept": accept}


def resolve_compute_dtype(name: str, device: str) -> torch.dtype:
    """The trainer's autocast dtype, by the one precision rule (:func:`r3rag.precision.choose_precision`:
    ``auto`` is bfloat16 on a GPU with native bf16 and on CPUs with avx512_bf16 / amx_bf16, float32
    elsewhere). fp16 is refused: this trainer has no loss scaler."""
    return rl_precision(name, device).dtype


def rl_precision(name: str, device: str) -> Precision:
    p = choose_precision(name, device)
    if p.name == "fp16":
        raise ConfigError("model.compute_dtype: fp16 needs a loss scaler, which the RL trainer does not have; use bf16 or fp32")
    return p


def resolve_rollout_weights(name: str, compute_dtype: torch.dtype, device: str) -> str:
    """``auto``: a bf16 copy (``bfloat16``) on a CPU whose compute dtype is bfloat16, else the
    trainer's own model (``shared``). Under CPU autocast every decode step casts every float32
    weight to bf16 again (55% of a one-row step in a torch-profiler trace); the copy decoded
    1.5x faster per step in the RL rollout (benchmark/perf/rl_rollout.py, docs/results/rl.md). On CUDA
    the casts are cheap and the copy is not measured, so ``shared`` stays.

    >>> resolve_rollout_weights("auto", torch.bfloat16, "cpu"), resolve_rollout_weights("auto", torch.float32, "cpu")
    ('bfloat16', 'shared')
    >>> resolve_rollout_weights("auto", torch.bfloat16, "cuda:0"), resolve_rollout_weights("shared", torch.bfloat16, "cpu")
    ('shared', 'shared')
    """
    if name != "auto":
        return name
    return "bfloat16" if compute_dtype == torch.bfloat16 and device.startswith("cpu") else "shared"


def next_iteration_fits(elapsed_s: float, last_iteration_s: float, max_minutes: float | None) -> bool:
    """Whether another iteration, as long as the last one, still ends within ``max_minutes``
    (``None``: no limit). The loop checks between iterations, so this is what keeps a run from
    overrunning its budget by up to one iteration.

    >>> next_iteration_fits(100.0, 100.0, 4)   # 200 s <= 240 s
    True
    >>> next_iteration_fits(150.0, 100.0, 4)   # 250 s > 240 s: stop now
    False
    >>> next_iteration_fits(1e9, 1.0, None)
    True
    """
    if max_minutes is None:
        return True
    return elapsed_s + last_iteration_s <= max_minutes * 60


class DataOrder:
    """Question ``k`` of the whole run is ``perm_e[k % n]`` with ``e = k // n`` and ``perm_e`` a
    permutation seeded by ``(seed, e)``: each epoch visits every question once, in a new order."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def indices(self, it: int, per_iter: int) -> list[int]:
        ks = range(it * per_iter, (it + 1) * per_iter)
        return [int(self._perm(k // self.n)[k % self.n]) for k in ks]


class BalancedOrder:
    """Questions taken in turn from each stratum (the values of one metadata key, e.g. ``hops``):
    draw ``k`` of the run comes from stratum ``k % S`` (strata sorted by value), and within a
    stratum the draws follow that stratum's own :class:`DataOrder` (its own seed, from ``seed`` and the stratum),
    so small strata repeat before large ones are used up. Each stratum gets the same share of every
    iteration's prompts whatever its share of the split: the update is not dominated by the
    majority kind of question. Like :class:`DataOrder`, a pure function of the iteration.

    >>> order = BalancedOrder([1, 2, 2, 2, 2, 1], seed=0)
    >>> picks = order.indices(0, 4)
    >>> sorted([1, 2, 2, 2, 2, 1][i] for i in picks)
    [1, 1, 2, 2]
    """

    def __init__(self, keys: list[Any], seed: int) -> None:
        if not keys:
            raise ValueError("BalancedOrder needs at least one question")
        values = sorted(set(keys), key=lambda v: (str(type(v)), v))
        self.members = [[i for i, k in enumerate(keys) if k == v] for v in values]
        self.values = values
        self.orders = [DataOrder(len(m), seed + 1_000_003 * (j + 1)) for j, m in enumerate(self.members)]

    def indices(self, it: int, per_iter: int) -> list[int]:
        S = len(self.members)
        out = []
        for k in range(it * per_iter, (it + 1) * per_iter):
            s, j = k % S, k // S
            out.append(self.members[s][self.orders[s].indices(j, 1)[0]])
        return out


def data_order(questions: list[Any], seed: int, balance_by: str | None) -> DataOrder | BalancedOrder:
    """The run's question order: a seeded permutation per epoch, or balanced over ``balance_by``."""
    if not balance_by:
        return DataOrder(len(questions), seed)
    keys = [q.metadata.get(balance_by) for q in questions]
    missing = sum(k is None for k in keys)
    if missing:
        raise ConfigError(f"train.balance_by={balance_by!r}: {missing} of {len(keys)} training questions have no "
                          f"metadata[{balance_by!r}] (the world's questions have 'hops' and 'type')")
    return BalancedOrder(keys, seed)


def first_training_questions(order: DataOrder | BalancedOrder, questions: Sequence[Question], n: int | None,
                             per_iter: int) -> list[Question]:
    """The first ``n`` distinct questions of the run's training order (``n`` None: one iteration's),
    i.e. the prompts of its first iterations: an evaluation of these before and after training
    measures the reward RL optimised on the very questions it saw.

    >>> qs = list("abcdefgh")
    >>> first = first_training_questions(DataOrder(8, seed=3), qs, 5, per_iter=2)
    >>> first == [qs[i] for i in DataOrder(8, seed=3).indices(0, 2) + DataOrder(8, seed=3).indices(1, 2)
    ...           + DataOrder(8, seed=3).indices(2, 2)][:5]
    True
    """
    want = min(len(questions), n if n is not None else per_iter)
    picked: list[int] = []
    it = 0
    while len(picked) < want:
        for i in order.indices(it, per_iter):
            if i not in picked and len(picked) < want:
                picked.append(i)
        it += 1
    return [questions[i] for i in picked]


@dataclass
class Models:
    policy: Any
    tokenizer: Any
    reference: Any = None
    critic: ValueModel | None = None


def _lr_lambda(cfg: RLConfig) -> Callable[[int], float]:
    total = max(1, cfg.train.iterations)
    warm = cfg.algo.warmup_iters

    def f(i: int) -> float:
        if warm and i < warm:
            return (i + 1) / warm
        frac = (i - warm) / max(1, total - warm)
        if cfg.algo.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
        if cfg.algo.schedule == "linear":
            return max(0.0, 1.0 - frac)
        return 1.0

    return f


class RLTrainer:
    """One run (one stage) of :mod:`r3rag.train.rl`. Every heavy piece can be passed in (tests use
    a tiny model, an in-memory retriever and their own reward); otherwise it is built from ``cfg``."""

    def __init__(
        self,
        cfg: RLConfig,
        out_dir: str | Path,
        *,
        model: Any = None,
        tokenizer: Any = None,
        retriever: Any = None,
        questions: Sequence[Question] | None = None,
        eval_questions: Sequence[Question] | None = None,
        reward_fn: RewardFn | None = None,
    ) -> None:
        self.cfg = cfg
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        if cfg.model.threads:
            torch.set_num_threads(cfg.model.threads)
        self.device = torch.device(cfg.model.device)
        self.precision = rl_precision(cfg.model.compute_dtype, cfg.model.device)
        self.dtype = self.precision.dtype
        self.rollout_weights = resolve_rollout_weights(cfg.model.rollout_weights, self.dtype, cfg.model.device)
        self.precision.write(self.out, "rl", rollout_weights=self.rollout_weights, rollout_backend=cfg.model.rollout_backend,
                             weights="float32 (autocast in the precision)")
        self._questions, self._eval_questions, self._retriever = questions, eval_questions, retriever
        self.last_checkpoint_s: float | None = None
        self.skipped_note = ""
        self._model, self._tokenizer, self._reward_fn = model, tokenizer, reward_fn

    # ---- building ----------------------------------------------------------------------------------
    def _build(self) -> None:
        from r3rag.rollout.backends.hf import HFBackend, load_model

        cfg = self.cfg
        if self._model is None:
            self._model, self._tokenizer = load_model(cfg.model.path, dtype="float32", device=cfg.model.device)
        policy = self._model
        strip_quantizer(policy)  # a GGUF model is dequantised float weights by now: train it as such
        policy.to(device=self.device, dtype=torch.float32)
        policy.config.use_cache = True
        reference = None
        if cfg.algo.kl_coef > 0:
            reference = copy.deepcopy(policy).eval()
            reference.requires_grad_(False)
        critic = ValueModel(policy).to(self.device) if cfg.algo.estimator == "gae" else None
        self.frozen = freeze_lower_layers(policy, cfg.model.trainable_layers)
        self.models = Models(policy, self._tokenizer, reference, critic)
        self.backend = self._rollout_backend(HFBackend, policy)
        if self._questions is None or self._retriever is None:
            from r3rag.evaluation.components import load_retriever
            from r3rag.evaluation.datasets import resolve_dataset

            train_ds = resolve_dataset(cfg.data)
            if self._questions is None:
                self._questions = train_ds.questions
            if self._retriever is None:
                self._retriever = load_retriever(cfg.retriever, train_ds)
        wants_eval = bool(cfg.train.eval_every or cfg.train.eval_at_start or cfg.train.eval_at_end)
        if self._eval_questions is None and wants_eval and cfg.eval.questions == "dataset":
            from r3rag.evaluation.datasets import resolve_dataset

            self._eval_questions = resolve_dataset(cfg.eval.dataset).questions
        self.questions = list(self._questions)
        if cfg.train.skip_guessable:
            self.questions, dropped = drop_guessable(self.questions)
            if not self.questions:
                raise ConfigError(f"train.skip_guessable: every one of the {sum(dropped.values())} training questions is guessable "
                                  "(yes/no or a two-way choice); nothing is left to train on")
            self.skipped_note = (f"train.skip_guessable: {sum(dropped.values())} guessable training questions left out ("
                                 + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) + f"), {len(self.questions)} kept")
        self.eval_questions = list(self._eval_questions or [])
        self.engine = RolloutEngine(self.backend, self._retriever, cfg.rollout)
        self.eval_engine = RolloutEngine(
            self.backend, self._retriever, cfg.rollout.model_copy(update={"n_samples": 1, "temperature": 0.0, "temperatures": None})
        )
        if self._reward_fn is None:
            from r3rag.rewards.recipes import load_recipe

            self._reward_fn = load_recipe(cfg.reward.recipe, cfg.reward.overrides).score
        self.reward_fn = self._reward_fn
        a = cfg.algo
        trainable = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=a.lr, betas=a.betas, weight_decay=a.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        self.critic_optimizer = None
        if critic is not None:
            self.critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=a.critic_lr, betas=a.betas, weight_decay=a.weight_decay)
        self.order = data_order(self.questions, cfg.train.seed, cfg.train.balance_by)
        if cfg.eval.questions == "training" and wants_eval:
            self.eval_questions = first_training_questions(self.order, self.questions, cfg.eval.dataset.limit,
                                                           cfg.train.questions_per_iter)
        self._arun_takes_seed = "seed" in inspect.signature(self.engine.arun).parameters

    def _objects(self) -> dict[str, Any]:
        return {
            "policy": self.models.policy, "critic": self.models.critic, "optimizer": self.optimizer,
            "scheduler": self.scheduler, "critic_optimizer": self.critic_optimizer,
        }

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> Path:
        """Train (resuming from the newest checkpoint), evaluate, write the final HF folder; returns it."""
        final = self.out / "final"
        if (self.out / DONE).is_file() and final.is_dir():
            more = self.room_to_continue()
            if more is None:
                return final
            print(more, flush=True)
            (self.out / DONE).unlink()
        self._build()
        cfg = self.cfg
        (self.out / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
        start, trained_s, last_iter_s = 0, 0.0, 0.0
        ckpt = latest_checkpoint(self.out)
        if ckpt is not None:
            state = load_checkpoint(ckpt, self._objects(), map_location=self.device)
            start = int(state["completed"])
            # the time budget spans kills: training time before the kill counts, and a run that
            # stopped for time stays stopped (unless train.max_minutes was raised since)
            trained_s, last_iter_s = float(state.get("train_s", 0.0)), float(state.get("last_iteration_s", 0.0))
        self.log = MetricsLog(self.out, start, cfg.train.tensorboard, cfg.train.wandb_project, self.out.name,
                              cfg.model_dump(mode="json"))
        from tqdm import tqdm

        budget = f" (stops within {cfg.train.max_minutes:g} min)" if cfg.train.max_minutes is not None else ""
        bar = tqdm(total=cfg.train.iterations, initial=start, desc=f"rl {self.out.name}{budget}", unit="it", disable=not cfg.train.progress)
        if self.frozen.trainable_params < self.frozen.total_params:
            f = self.frozen
            bar.write(f"training the top {f.trainable_layers} of {f.layers} decoder layers: {f.trainable_params / 1e6:.1f}M "
                      f"of {f.total_params / 1e6:.1f}M parameters (model.trainable_layers)")
        if self.skipped_note:
            bar.write(self.skipped_note)
        try:
            if start == 0 and cfg.train.eval_at_start and self.eval_questions:
                self._evaluate(0)
            t_begin = time.perf_counter() - trained_s  # the budget is for training: the evaluation before it is not counted
            completed = start
            resumed_out_of_time = start > 0 and not next_iteration_fits(trained_s, last_iter_s, cfg.train.max_minutes)
            if resumed_out_of_time:
                bar.write(f"resumed after {start} iterations and {trained_s / 60:.1f} min of training: another "
                          f"iteration ({last_iter_s:.0f} s) would not fit in train.max_minutes={cfg.train.max_minutes:g}; "
                          "writing the final model")
            end = start if resumed_out_of_time else cfg.train.iterations
            for it in range(start, end):
                t_iter = time.perf_counter()
                rec = self.iteration(it)
                if self.last_checkpoint_s is not None:  # the save that ended the previous iteration
                    rec["time/checkpoint"], self.last_checkpoint_s = self.last_checkpoint_s, None
                completed = it + 1
                last = completed == cfg.train.iterations
                now = time.perf_counter()
                out_of_time = not next_iteration_fits(now - t_begin, now - t_iter, cfg.train.max_minutes)
                at_end = cfg.train.eval_at_end and (last or out_of_time)
                if self.eval_questions and ((cfg.train.eval_every and completed % cfg.train.eval_every == 0) or at_end):
                    rec.update(self._evaluate(completed, log=False))
                self.log.write(rec)
                bar.update(1)
                bar.set_postfix(reward=f"{rec.get('reward/total', 0):.3f}", **({"em": rec["eval/em"]} if "eval/em" in rec else {}))
                if completed % cfg.train.checkpoint_every == 0 or last or out_of_time:
                    self._checkpoint(completed, train_s=now - t_begin, last_iteration_s=now - t_iter)
                if out_of_time:
                    break
        finally:
            bar.close()
            self.log.close()
        save_hf_folder(self.models.policy, self.models.tokenizer, final)
        self._report()
        (self.out / DONE).write_text("done\n", encoding="utf-8")
        return final

    def room_to_continue(self) -> str | None:
        """Whether a finished run goes on: when ``train.iterations`` or ``train.max_minutes`` were
        raised since, so that another iteration fits after its last checkpoint (judged as the loop
        judges it, with the training time and last iteration's length the checkpoint saved). Returns
        the message saying so, or None (the run stays finished; also when its checkpoints were
        deleted, as the quickstart does once a stage is done)."""
        ckpt = latest_checkpoint(self.out)
        if ckpt is None:
            return None
        state = read_state(ckpt)
        done, tr = int(state["completed"]), self.cfg.train
        if done >= tr.iterations or not next_iteration_fits(float(state.get("train_s", 0.0)),
                                                             float(state.get("last_iteration_s", 0.0)), tr.max_minutes):
            return None
        budget = f", train.max_minutes={tr.max_minutes:g}" if tr.max_minutes is not None else ""
        return (f"{self.out}: finished after {done} iterations; train.iterations={tr.iterations}{budget} allow more: "
                f"continuing from its last checkpoint")

    def _checkpoint(self, completed: int, train_s: float, last_iteration_s: float) -> None:
        t = time.perf_counter()
        save_checkpoint(self.out, completed, self._objects(), {"seed": self.cfg.train.seed, "questions": len(self.questions),
                        "per_iter": self.cfg.train.questions_per_iter, "train_s": round(train_s, 3),
                        "last_iteration_s": round(last_iteration_s, 3)}, keep=self.cfg.train.keep_checkpoints)
        self.last_checkpoint_s = time.perf_counter() - t

    def _report(self) -> None:
        """Before/after comparison (paired bootstrap) and the curves."""
        evals = sorted((self.out / "eval").glob("step_*.jsonl")) if (self.out / "eval").is_dir() else []
        if len(evals) >= 2:
            from r3rag.evaluation.predictions import load_rows

            before, after = load_rows(evals[0]), load_rows(evals[-1])
            report = {m: ev.paired_difference(before, after, m) for m in ("em", "f1", "cover_em")}
            reward = ev.paired_reward(before, after)
            if reward is not None:  # eval.questions=training: the reward on the run's own questions
                report["reward"] = reward
            report["retrievals_by_hops"] = {"before": ev.retrievals_by_hops(before), "after": ev.retrievals_by_hops(after)}
            report["files"] = [evals[0].name, evals[-1].name]
            ev.write_json(self.out / "eval_report.json", report)
        if self.cfg.train.plots:
            from r3rag.train.rl.plots import plot_curves

            plot_curves(self.out)

    def _evaluate(self, step: int, log: bool = True) -> dict[str, Any]:
        t = time.perf_counter()
        self._refresh_backend()
        self.models.policy.eval()
        rows = ev.evaluate_policy(self.eval_engine, self.eval_questions, ev.eval_path(self.out, step),
                                  self.cfg.eval.normalization, self.cfg.eval.batch_size,
                                  reward_fn=self.reward_fn if self.cfg.eval.questions == "training" else None)
        rec = ev.summary(rows)
        rec["time/eval"] = time.perf_counter() - t
        if log:
            self.log.write({"step": step, "kind": "eval", **rec})
        return rec

    def _rollout_backend(self, backend_cls: Any, policy: Any) -> Any:
        """The rollout's generator. ``shared``: the trainer's own model object under autocast in the
        compute dtype (the trainer recomputes its log-probs the same way); ``bfloat16``: a bf16
        copy of it (no per-op casts, half the weight memory traffic), which
        :meth:`_refresh_backend` reloads from the trainer's weights before every rollout."""
        cfg = self.cfg
        if cfg.model.rollout_backend == "vllm":
            return self._vllm_backend(policy)
        if self.rollout_weights == "bfloat16":
            gen = copy.deepcopy(policy).to(dtype=torch.bfloat16).eval()
            gen.requires_grad_(False)
            return backend_cls(gen, self._tokenizer, max_batch_size=cfg.model.max_batch_size, inline=cfg.model.rollout_inline)
        autocast = self.dtype if self.dtype != torch.float32 else None
        return backend_cls(policy, self._tokenizer, max_batch_size=cfg.model.max_batch_size, autocast_dtype=autocast,
                           inline=cfg.model.rollout_inline)

    def _vllm_backend(self, policy: Any) -> Any:
        """A vLLM engine colocated with the trainer (in this process, on the same device).

        vLLM reads only HF folders, so the starting weights are written to ``OUT/rollout-init``
        first (the packaged GGUF or a hub name becomes a folder too); from then on the engine gets
        the trainer's weights before every rollout (:meth:`_refresh_backend`, through
        ``VLLMBackend.update_weights``), so a resumed run never samples with the starting ones.
        On a GPU give vLLM a share of the memory (``model.rollout_engine_kwargs:
        {gpu_memory_utilization: 0.3}``): the trainer needs the rest."""
        from r3rag.rollout.backends import vllm as vllm_backend

        cfg = self.cfg
        init = save_hf_folder(policy, self._tokenizer, self.out / "rollout-init")
        kwargs = {"dtype": self.precision.torch_name, "seed": cfg.train.seed,
                  **cfg.model.rollout_engine_kwargs}
        return vllm_backend.VLLMBackend(str(init), tokenizer=self._tokenizer, **kwargs)

    def _refresh_backend(self) -> None:
        update = getattr(self.backend, "update_weights", None)
        m = self.cfg.model
        if m.rollout_backend == "vllm" or self.rollout_weights == "bfloat16":  # the rollout's own copy: send it the weights
            self.backend.update_weights(self.models.policy.state_dict())  # vLLM reloads in place; the bf16 copy casts
            return
        try:
            if update is not None:
                update(None)
            else:
                self.backend.clear_cache()
        except Exception:  # noqa: BLE001 - a backend without the hook: clearing its caches is enough
            self.backend.clear_cache()

    def _pad_id(self) -> int:
        """Filler of the trainer's padded rows (masked out everywhere): the HF backend's pad id, else the
        tokenizer's pad or end-of-sequence token."""
        pad = getattr(self.backend, "pad_id", None)
        if pad is None:
            tok = self.models.tokenizer
            pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        return int(pad)

    # ---- one iteration -------------------------------------------------------------------------------
    def _rollout(self, it: int) -> list[Trajectory]:
        cfg = self.cfg
        qs = [self.questions[i] for i in self.order.indices(it, cfg.train.questions_per_iter)]
        seed = cfg.rollout.seed + 1_000_003 * cfg.train.seed + it
        if cfg.rollout.tree is not None:
            from r3rag.rollout.tree import tree_rollout

            return asyncio.run(tree_rollout(self.engine, qs, cfg.rollout.tree, seed=seed))
        if self._arun_takes_seed:
            return asyncio.run(self.engine.arun(qs, seed=seed))
        self.engine.config = cfg.rollout.model_copy(update={"seed": seed})
        return asyncio.run(self.engine.arun(qs))

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def iteration(self, it: int) -> dict[str, Any]:
        cfg, a, m = self.cfg, self.cfg.algo, self.models
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        s0 = dict(self.engine.stats.to_dict())
        self._refresh_backend()
        m.policy.eval()
        trajs = self._rollout(it)
        t1 = time.perf_counter()
        s1 = self.engine.stats.to_dict()
        times["time/rollout"] = t1 - t0
        times["time/generate"] = s1["generate_s"] - s0["generate_s"]
        times["time/retrieve"] = s1["retrieve_s"] - s0["retrieve_s"]
        rewards = self.reward_fn(trajs)
        t2 = time.perf_counter()
        times["time/reward"] = t2 - t1
        rec: dict[str, Any] = {"step": it + 1, "kind": "train"}
        rec.update(self._rollout_stats(trajs, rewards))
        sel = select(trajs, rewards, grouped=a.estimator in GROUP_ESTIMATORS, dynamic_filtering=a.dynamic_filtering, tol=a.filter_tol,
                     truncated=TRUNCATED if a.overlong_filtering else (), **rft_selection(a))
        n = max(1, len(trajs))
        rec.update({
            "batch/trajectories": len(trajs), "batch/kept": len(sel.keep), "batch/groups": sel.groups,
            "batch/filtered_fraction": sel.filtered_fraction, "batch/rejected_fraction": sel.rejected / n,
            "batch/dropped_fraction": sel.dropped / n, "batch/overlong_fraction": sel.overlong / n,
            "batch/untrainable_fraction": sel.untrainable / n, "batch/dropped": sel.dropped, "batch/untrainable": sel.untrainable,
        })
        if sel.keep:
            kept = [trajs[i] for i in sel.keep]
            batch = build_batch(kept, [rewards[i] for i in sel.keep], self._pad_id(), cfg.rollout.temperature_for)
            rec.update(self._train_on(batch, times, it))
        else:
            times["time/forward"] = times["time/update"] = 0.0
        self.scheduler.step()
        total = time.perf_counter() - t0
        times["time/iteration"] = total
        times["time/overhead"] = total - times["time/generate"] - times["time/forward"] - times["time/update"]
        times["time/overhead_fraction"] = times["time/overhead"] / total if total > 0 else 0.0
        rec["policy/lr"] = self.scheduler.get_last_lr()[0]
        rec.update(times)
        return rec

    def _rollout_stats(self, trajs: Sequence[Trajectory], rewards: Sequence[RewardOutput]) -> dict[str, Any]:
        n = max(1, len(trajs))
        out: dict[str, Any] = {k: v for k, v in summarize(rewards).items()}
        stops = Counter(t.stop_reason or "none" for t in trajs)
        for k, v in stops.items():
            out[f"stop/{k}"] = v / n
        out["rollout/generated_tokens"] = sum(own_generated_tokens(t) for t in trajs) / n  # a tree branch's copied prefix: not generated again
        out["rollout/retrievals"] = sum(t.num_retrievals for t in trajs) / n
        out["rollout/steps"] = sum(len(t.steps) for t in trajs) / n
        out["rollout/format_error_rate"] = sum(any(s.format_error for s in t.steps) for t in trajs) / n
        out["rollout/answered"] = sum(t.answer is not None for t in trajs) / n
        return out

    def _to(self, b: RolloutBatch) -> RolloutBatch:
        d = self.device
        return RolloutBatch(b.input_ids.to(d), b.attention_mask.to(d), b.action_mask.to(d), b.step_rewards, b.rollout_logprobs,
                            b.temperatures.to(d), b.group, b.totals, b.lengths, b.step_table, b.query_steps, b.step_id,
                            b.tree_node, b.tree_child, b.tree_at)

    def old_logprobs_from_update(self) -> bool:
        """Without a reference model, the rows of the first optimizer step of the first pass take
        their "old" log-probs from their own update forward (detached: ratio 1, the same gradient),
        since no step has changed the weights yet; only the rows of later steps (``train_batch_size``
        smaller than the batch) get the no-grad policy pass before any update. With one step per
        batch no such pass runs. With a reference the KL (in the reward) needs every row's old
        log-probs before the advantages. The reused forward runs in train mode: the same numbers
        as the no-grad pass for a model without dropout (SmolLM2, Qwen2.5 and Llama have none); a
        model with dropout gets old log-probs drawn under its dropout."""
        return self.models.reference is None

    def _train_on(self, batch: RolloutBatch, times: dict[str, float], it: int = 0) -> dict[str, Any]:
        cfg, a, m = self.cfg, self.cfg.algo, self.models
        t0 = time.perf_counter()
        B, L = batch.action_mask.shape
        def split(epoch: int) -> tuple[list[list[int]], list[list[list[int]]]]:
            """Rows per optimizer step (shuffled anew each pass), each step's rows cut into micro-batches."""
            steps = optimizer_steps(B, a.train_batch_size, seed=1_000_003 * cfg.train.seed + it + 7_919 * epoch)
            return steps, [[[step[j] for j in mb] for mb in micro_batches([batch.lengths[i] for i in step], a.micro_batch_tokens)]
                           for step in steps]

        steps, plan = split(0)
        old = torch.zeros(B, L)
        ref = torch.zeros(B, L) if m.reference is not None else None
        values = torch.zeros(B, L) if m.critic is not None else None
        reuse_old = self.old_logprobs_from_update()
        with torch.no_grad(), self._autocast():
            for k, mbs in enumerate(plan):
                need_old = not (reuse_old and k == 0)
                if not (need_old or ref is not None or values is not None):
                    continue
                for idx in mbs:
                    mb = self._to(batch.rows(idx))
                    w = mb.action_mask.shape[1]
                    if need_old:
                        lp, _ = policy_logprobs(m.policy, mb.input_ids, mb.attention_mask, mb.action_mask, mb.temperatures)
                        old[idx, :w] = lp.cpu()
                    if ref is not None:
                        rl, _ = policy_logprobs(m.reference, mb.input_ids, mb.attention_mask, mb.action_mask, mb.temperatures)
                        ref[idx, :w] = rl.cpu()
                    if values is not None:
                        values[idx, :w] = (m.critic(mb.input_ids, mb.attention_mask) * mb.action_mask).cpu()
        mask = batch.action_mask
        kl = approx_kl(old, ref, a.kl_estimator) * mask if ref is not None else None
        adv = compute_advantages(
            a.estimator, batch.step_rewards, mask, batch.group, kl=kl, kl_coef=0.0 if a.kl_use_loss else a.kl_coef,
            values=values, gamma=a.gamma, lambd=a.lambd, no_std_norm=a.no_std_norm, reward_clip=a.reward_clip,
            step_layout=batch.layout_for(a.estimator), min_std=a.min_group_std,
        )
        t1 = time.perf_counter()
        times["time/forward"] = t1 - t0
        stats: dict[str, float] = Counter()
        for epoch in range(a.epochs_per_batch):
            if epoch > 0:
                steps, plan = split(epoch)  # every row's old log-probs are known after the first pass
            for k, (step, mbs) in enumerate(zip(steps, plan)):
                fresh = reuse_old and epoch == 0 and k == 0  # these rows' old log-probs come from this forward
                stats_k = self._optimizer_step(batch, step, mbs, old, ref, values, adv, fresh)
                for key, v in stats_k.items():
                    stats[key] += v
        if cfg.model.gradient_checkpointing:
            m.policy.gradient_checkpointing_disable()
        m.policy.config.use_cache = True
        m.policy.eval()
        times["time/update"] = time.perf_counter() - t1
        n_updates = a.epochs_per_batch * len(steps)  # every pass cuts the same number of steps
        out = {key: v / n_updates for key, v in stats.items()}  # the mean over optimizer steps
        known = mask.bool() & ~torch.isnan(batch.rollout_logprobs)
        if known.any():
            out["policy/logprob_mismatch"] = float((batch.rollout_logprobs[known] - old[known]).abs().mean())
        if kl is not None:
            out["kl/mean"] = float(kl.sum() / mask.sum())
        if a.estimator in GROUP_ESTIMATORS and batch.tree_node is not None:  # flat groups: one-level trees
            from r3rag.train.rl.tree import informative_comparisons

            groups, informative = informative_comparisons(batch.totals, batch.tree_node, batch.tree_child, a.min_group_std)
            out["tree/sibling_groups"], out["tree/informative_groups"] = groups, informative
            out["tree/informative_per_1k_tokens"] = 1000.0 * informative / max(1.0, float(mask.sum()))
        out["advantage/mean"] = float((adv.advantages * mask).sum() / mask.sum())
        out["advantage/abs_mean"] = float((adv.advantages.abs() * mask).sum() / mask.sum())
        out["batch/generated_tokens"] = float(mask.sum())
        out["batch/padded_tokens"] = float(sum(len(i) * max(batch.lengths[j] for j in i) for mbs in plan for i in mbs))
        out["batch/micro_batches"] = sum(len(mbs) for mbs in plan)
        out["batch/optimizer_steps"] = n_updates
        return out

    def _optimizer_step(self, batch: RolloutBatch, step: Sequence[int], mbs: Sequence[Sequence[int]], old: torch.Tensor,
                        ref: torch.Tensor | None, values: torch.Tensor | None, adv: Any, fresh: bool) -> dict[str, float]:
        """One optimizer step over the rows ``step`` (micro-batches ``mbs``): every loss is divided by
        the step's generated tokens, so the accumulated gradient is the step's token mean. ``fresh``:
        write these rows' old log-probs from this forward first (no step has moved the weights yet)."""
        cfg, a, m = self.cfg, self.cfg.algo, self.models
        n_tok = float(batch.action_mask[list(step)].sum())
        stats: dict[str, float] = Counter()
        m.policy.zero_grad(set_to_none=True)  # every parameter, frozen ones too: no stale gradient reaches the norm
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
        m.policy.train()
        if cfg.model.gradient_checkpointing:
            # non-reentrant (PyTorch's recommended form); with frozen lower layers the trainable
            # blocks get the plain backward's gradients (tests/test_rl_freeze.py)
            m.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for idx in mbs:
            mb = self._to(batch.rows(idx))
            w = mb.action_mask.shape[1]
            ix = torch.as_tensor(idx)
            sl = (ix[:, None], torch.arange(w)[None, :])
            with self._autocast():
                lp, ent = policy_logprobs(m.policy, mb.input_ids, mb.attention_mask, mb.action_mask, mb.temperatures, entropy=True)
                if fresh:
                    old[sl] = lp.detach().float().cpu()
                pl, st = policy_loss(lp, old[sl].to(lp.device), adv.advantages[sl].to(lp.device), mb.action_mask, n_tok,
                                     a.clip_eps_low, a.clip_eps_high, a.dual_clip)
                loss = pl
                ent_mean = (ent * mb.action_mask).sum() / n_tok
                if a.entropy_coef > 0:
                    loss = loss - a.entropy_coef * ent_mean
                if a.kl_use_loss and ref is not None:
                    kll = kl_loss(lp, ref[sl].to(lp.device), mb.action_mask, a.kl_estimator, n_tok)
                    loss = loss + a.kl_coef * kll
                    stats["loss/kl"] += float(kll.detach())
                if m.critic is not None:
                    v = m.critic(mb.input_ids, mb.attention_mask)
                    vl = value_loss(v, values[sl].to(v.device), adv.returns[sl].to(v.device), mb.action_mask, n_tok, a.value_clip)
                    loss = loss + a.vf_coef * vl
                    stats["loss/value"] += float(vl.detach())
            loss.backward()
            frac = float(mb.action_mask.sum()) / n_tok
            stats["loss/policy"] += float(pl.detach())
            stats["policy/entropy"] += float(ent_mean.detach())
            stats["policy/clip_frac"] += st["clip_frac"] * frac
            stats["policy/ppo_kl"] += st["ppo_kl"] * frac
        stats["policy/grad_norm"] += float(torch.nn.utils.clip_grad_norm_(m.policy.parameters(), a.max_grad_norm))
        self.optimizer.step()
        if self.critic_optimizer is not None:
            torch.nn.utils.clip_grad_norm_(m.critic.parameters(), a.max_grad_norm)
            self.critic_optimizer.step()
        return stats


def _carry_last_eval(prev_dir: Path, stage_dir: Path, cfg: RLConfig) -> None:
    """The previous stage's last evaluation is this stage's "before" (same model, same held-out
    questions when the eval section is unchanged): copied, not recomputed."""
    import shutil

    from r3rag.config import read_yaml

    prev_cfg = prev_dir / "config.yaml"
    evals = sorted((prev_dir / "eval").glob("step_*.jsonl")) if (prev_dir / "eval").is_dir() else []
    target = ev.eval_path(stage_dir, 0)
    if not evals or target.exists() or not prev_cfg.is_file():
        return
    if read_yaml(prev_cfg).get("eval") != cfg.eval.model_dump(mode="json"):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(evals[-1], target)


# ---- schedules: one run, or stages each starting from the previous one's final model ----------------
def run_schedule(config_path: str | Path | None, overrides: Sequence[str], out_dir: str | Path, **inject: Any) -> Path:
    """Run the config (all its stages, in order) into ``out_dir``; returns the last final model folder.

    Stage ``k`` loads the file, applies its own ``set`` overrides, then the command line's, and (for
    ``k > 0``) starts from stage ``k-1``'s ``final/`` folder. A finished stage (``DONE``) is skipped,
    so rerunning a killed schedule resumes where it stopped."""
    from r3rag.config import load_config

    base = load_config(RLConfig, config_path, overrides).check()
    out = Path(out_dir)
    if not base.stages:
        return RLTrainer(base, out, **inject).run()
    previous: Path | None = None
    for stage in base.stages:
        extra = list(stage.set) + list(overrides)
        if previous is not None:
            extra.append(f"model.path={previous}")
        cfg = load_config(RLConfig, config_path, extra).check()
        inj = dict(inject)
        if previous is not None:
            inj.pop("model", None)
            inj.pop("tokenizer", None)
            _carry_last_eval(previous.parent, out / stage.name, cfg)
        previous = RLTrainer(cfg, out / stage.name, **inj).run()
    assert previous is not None
    return previous
