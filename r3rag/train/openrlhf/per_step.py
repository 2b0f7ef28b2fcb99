"""Per-step rewards inside stock OpenRLHF 0.11.2, by wrapping three of its functions (no fork).

Stock OpenRLHF sums an agent's step rewards into one number and puts it on the last generated
token. R3-RAG scores every step, and each step's reward belongs on that step's last token. The
executor (:mod:`.rollout`) already returns, besides the usual ``reward``, one reward per action
range (``r3rag_step_rewards``) and whether the sample must be dropped (``r3rag_dropped``).
:func:`install` wraps, in the process where the trainer runs:

1. ``SamplesGenerator._process_response_into_experience`` (``trainer/ppo_utils/samples_generator.py``):
   after the stock conversion, the step rewards become a dense ``(1, A)`` tensor aligned with the
   experience's ``action_mask`` (:func:`~.placement.dense_step_rewards`), carried in
   ``experience.info`` (which OpenRLHF pads and concatenates with the rest of the sample), and the
   drop flag too;
2. ``RemoteExperienceMaker.compute_advantages_and_returns`` (``trainer/ppo_utils/experience_maker.py``):
   before the stock code runs, a dropped sample's reward is set to the mean reward of the kept
   samples of its prompt group (so a group baseline is computed from kept samples only; its action
   mask is already empty, so it adds nothing to any loss); the dense step rewards are registered
   by the identity of each experience's ``action_mask``; after it, they are removed from ``info``
   (they are not a metric);
3. ``compute_reward`` as imported by ``experience_maker``: for an experience with registered step
   rewards it returns :func:`~.placement.token_rewards` (steps on their last tokens, any shaping of
   the episode reward on the last token, clip, KL); otherwise the stock function runs unchanged.

Everything else (GAE, REINFORCE returns, advantage whitening, the losses) is stock code. The
wrappers are installed in every Ray worker by :mod:`.launch` (a ``worker_process_setup_hook``),
and :func:`install` is idempotent. :data:`TARGETS` names what is wrapped; a test fails when the
pinned OpenRLHF no longer has them with the expected signatures.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from r3rag.train.openrlhf.placement import dense_step_rewards, token_rewards

STEP_KEY = "r3rag_step_rewards"  # response key (list[float]) and experience.info key (dense tensor)
DROP_KEY = "r3rag_dropped"
GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")

#: (module, attribute, parameters the wrapper relies on)
TARGETS = (
    ("openrlhf.trainer.ppo_utils.samples_generator", "SamplesGenerator._process_response_into_experience",
     ("self", "response")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.compute_advantages_and_returns",
     ("self", "experiences")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "compute_reward",
     ("r", "kl_coef", "kl", "action_mask", "reward_clip_range")),
)

_REGISTRY: dict[int, torch.Tensor] = {}
_MARK = "__r3rag_per_step__"


def check_targets() -> list[str]:
    """Problems with the wrapped functions in the installed OpenRLHF (empty: all present)."""
    import importlib

    problems = []
    for module, attr, params in TARGETS:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                problems.append(f"{module}.{attr}: missing")
                break
        else:
            fn = getattr(obj, "__wrapped__", obj)
            names = list(inspect.signature(fn).parameters)
            if names[: len(params)] != list(params):
                problems.append(f"{module}.{attr}: parameters {names}, expected to start with {list(params)}")
    return problems


def attach(experience: Any, response: dict) -> Any:
    """Step 1: put the response's step rewards and drop flag into ``experience.info``."""
    n_actions = experience.action_mask.size(1)
    steps = response.get(STEP_KEY)
    if steps is not None:
        dense = dense_step_rewards(response["action_ranges"], steps, n_actions)
        experience.info[STEP_KEY] = dense.unsqueeze(0)
    experience.info[DROP_KEY] = torch.tensor([float(bool(response.get(DROP_KEY, False)))])
    return experience


def neutralise_dropped(experiences: list, n_samples_per_prompt: int) -> int:
    """Step 2a: a dropped sample's reward := mean reward of the kept samples of its prompt group
    (groups are consecutive runs of ``n_samples_per_prompt`` sample indices, as OpenRLHF builds
    them). In place; returns how many rewards were changed."""
    slots: dict[int, tuple[Any, int, bool]] = {}
    for exp in experiences:
        drop = exp.info.get(DROP_KEY)
        for j, idx in enumerate(exp.index or []):
            slots[int(idx)] = (exp, j, drop is not None and bool(drop[j] > 0.5))
    changed = 0
    for idx, (exp, j, dropped) in slots.items():
        if not dropped:
            continue
        g0 = idx - idx % n_samples_per_prompt
        group = [slots[k] for k in range(g0, g0 + n_samples_per_prompt) if k in slots]
        kept = [float(e.rewards[i]) for e, i, d in group if not d]
        exp.rewards[j] = sum(kept) / len(kept) if kept else 0.0
        changed += 1
    return changed


def _wrap_process(orig):
    @functools.wraps(orig)
    def wrapper(self, response, *args, **kwargs):
        return attach(orig(self, response, *args, **kwargs), response)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_advantages(orig):
    @functools.wraps(orig)
    def wrapper(self, experiences, *args, **kwargs):
        args_ = self.strategy.args
        if args_.algo.advantage.estimator in GROUP_ESTIMATORS and args_.rollout.n_samples_per_prompt > 1:
            for exp in experiences:
                exp.rewards = exp.rewards.to(torch.promote_types(exp.rewards.dtype, torch.float32))
            neutralise_dropped(experiences, args_.rollout.n_samples_per_prompt)
        keys = []
        for exp in experiences:
            dense = exp.info.get(STEP_KEY)
            if dense is not None:
                _REGISTRY[id(exp.action_mask)] = dense
                keys.append(id(exp.action_mask))
        try:
            return orig(self, experiences, *args, **kwargs)
        finally:
            for k in keys:
                _REGISTRY.pop(k, None)
            for exp in experiences:
                exp.info.pop(STEP_KEY, None)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_compute_reward(orig):
    @functools.wraps(orig)
    def wrapper(r, kl_coef, kl, action_mask=None, reward_clip_range=None):
        dense = _REGISTRY.get(id(action_mask)) if action_mask is not None else None
        if dense is None or isinstance(kl, list):
            return orig(r, kl_coef, kl, action_mask=action_mask, reward_clip_range=reward_clip_range)
        return token_rewards(r, dense.to(kl.device), kl_coef, kl, action_mask, reward_clip_range)

    setattr(wrapper, _MARK, True)
    return wrapper


def install() -> bool:
    """Wrap the three functions (idempotent). Returns False when they were already wrapped.
    Also the ``worker_process_setup_hook`` that :mod:`.launch` gives Ray."""
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator

    sg = samples_generator.SamplesGenerator
    if getattr(sg._process_response_into_experience, _MARK, False):
        return False
    problems = check_targets()
    if problems:
        raise RuntimeError("r3rag per-step rewards: OpenRLHF changed: " + "; ".join(problems))
    sg._process_response_into_experience = _wrap_process(sg._process_response_into_experience)
    em = experience_maker.RemoteExperienceMaker
    em.compute_advantages_and_returns = _wrap_advantages(em.compute_advantages_and_returns)
    experience_maker.compute_reward = _wrap_compute_reward(experience_maker.compute_reward)
    return True


def installed() -> bool:
    try:
        from openrlhf.trainer.ppo_utils import samples_generator
    except ImportError:
        return False
    return bool(getattr(samples_generator.SamplesGenerator._process_response_into_experience, _MARK, False))
