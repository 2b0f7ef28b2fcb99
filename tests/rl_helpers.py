"""Shared pieces for the RL trainer tests: a tiny policy, an in-memory retriever, a trivial reward."""

from __future__ import annotations

from typing import Sequence

from r3rag.data.records import Passage, Question
from r3rag.rewards.types import RewardOutput
from r3rag.rollout.trajectory import Trajectory

PASSAGES = [
    Passage("p1", "Varnel Oskaro\nVarnel Oskaro was born in Quessa in 1874."),
    Passage("p2", "Quessa\nQuessa is a town in the province of Dromel."),
    Passage("p3", "Tirra Olle\nTirra Olle founded Melvane Works."),
]
QUESTIONS = [Question(f"q{i}", f"Where was person {i} born?", ["Quessa"], {"hops": 1 + i % 2}) for i in range(16)]


class EvenTokenReward:
    """Trivial rewarded behaviour: the fraction of generated tokens whose id is even, on the last
    step (random models start near 0.5; a policy that learns it moves towards 1)."""

    def __call__(self, trajs: Sequence[Trajectory]) -> list[RewardOutput]:
        out = []
        for t in trajs:
            ids = [i for s in t.segments if s.role == "model" for i in s.token_ids]
            r = sum(1 for i in ids if i % 2 == 0) / len(ids) if ids else 0.0
            per = [0.0] * max(1, len(t.steps))
            per[-1] = r
            out.append(RewardOutput(r, per, {"even": r}))
        return out


def tiny_cfg(estimator: str, iterations: int = 6, **algo):
    from r3rag.train.rl.config import RLConfig

    a = {"estimator": estimator, "lr": 2e-2, "critic_lr": 1e-3, "dynamic_filtering": False, **algo}
    return RLConfig.model_validate({
        "model": {"compute_dtype": "float32"},
        "rollout": {"format": "r3rag_steps", "n_samples": 4, "temperature": 1.0, "max_steps": 1,
                    "max_turn_tokens": 8, "max_new_tokens": 8, "docs_per_step": 1},
        "algo": a,
        "train": {"iterations": iterations, "questions_per_iter": 4, "checkpoint_every": 100, "eval_at_start": False,
                  "progress": False, "tensorboard": False, "plots": False},
    })


def tiny_trainer(cfg, out, seed: int = 0, reward=None):
    from r3rag.testing.fake_retriever import OverlapRetriever
    from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer
    from r3rag.train.rl.loop import RLTrainer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, seed=seed)
    return RLTrainer(cfg, out, model=model, tokenizer=tok, retriever=OverlapRetriever(PASSAGES), questions=QUESTIONS,
                     eval_questions=[], reward_fn=reward or EvenTokenReward())
