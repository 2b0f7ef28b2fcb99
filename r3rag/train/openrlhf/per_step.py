"""Per-step rewards and the single machine's objective inside stock OpenRLHF 0.11.2, by wrapping five
of its functions (no fork).

Stock OpenRLHF sums an agent's step rewards into one number and puts it on the last generated
token, takes every sample of a prompt group into its baselines, divides by a group std however
small, and runs GAE over every response position (a retrieved document's tokens count as time
steps). The single-machine trainer (:mod:`r3rag.train.rl.estimators`) does none of these; this
hook makes OpenRLHF compute the same advantages. The executor (:mod:`.rollout`) returns, besides
the usual ``reward``, one reward per action range (``r3rag_step_rewards``) and whether the sample
must be dropped (``r3rag_dropped``). :func:`install` wraps, in the process where the trainer runs:

1. ``SamplesGenerator._process_response_into_experience`` (``trainer/ppo_utils/samples_generator.py``):
   after the stock conversion, the step rewards become a dense ``(1, A)`` tensor aligned with the
   experience's ``action_mask`` (:func:`~.placement.dense_step_rewards`), carried in
   ``experience.info`` (which OpenRLHF pads and concatenates with the rest of the sample), and the
   drop flag too;
2. ``RemoteExperienceMaker.compute_advantages_and_returns`` (``trainer/ppo_utils/experience_maker.py``):
   registers the call's experiences (by the identity of each one's ``action_mask``) and runs the
   stock code; afterwards the step rewards leave ``info`` (they are not a metric);
3. ``compute_reward`` as imported by ``experience_maker``: at its first call of a batch (after
   OpenRLHF's own length penalties changed ``experience.rewards``) the group shaping of every
   sample is computed by :func:`r3rag.train.rl.estimators.shaping` from the **kept** samples only
   (not dropped, at least one action token; groups are runs of ``n_samples_per_prompt`` sample
   indices, ``flash_reinforce`` takes the whole batch), with the vanishing-spread guard
   (``R3RAG_MIN_GROUP_STD``, default :data:`~r3rag.train.rl.estimators.MIN_STD`); each call then
   returns :func:`~.placement.token_rewards` (step rewards times the scale, the shift on the last
   token, OpenRLHF's ``--reward.clip_range``, KL). The scalar stock shaped is not used;
4. ``RemoteExperienceMaker.get_advantages_and_returns`` (GAE) and ``get_cumulative_returns``
   (the REINFORCE family): the stock recursion runs on each row's action positions packed to the
   front (:func:`~.placement.pack_actions`) and is scattered back, so documents are not time steps.

Advantage whitening and the losses are stock code. The wrappers are installed in every Ray
worker by :mod:`.launch` (a ``worker_process_setup_hook``), and :func:`install` is idempotent.
:data:`TARGETS` names what is wrapped; a test fails when the pinned OpenRLHF no longer has them
with the expected signatures. Packed samples (``kl`` as a list) keep stock code for 3.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from r3rag.train.openrlhf.placement import dense_step_rewards, pack_actions, token_rewards, unpack_actions

STEP_KEY = "r3rag_step_rewards"  # response key (list[float]) and experience.info key (dense tensor)
DROP_KEY = "r3rag_dropped"
ENV_MIN_STD = "R3RAG_MIN_GROUP_STD"

#: (module, attribute, parameters the wrapper relies on)
TARGETS = (
    ("openrlhf.trainer.ppo_utils.samples_generator", "SamplesGenerator._process_response_into_experience",
     ("self", "response")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.compute_advantages_and_returns",
     ("self", "experiences")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "compute_reward",
     ("r", "kl_coef", "kl", "action_mask", "reward_clip_range")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.get_advantages_and_returns",
     ("self", "values", "rewards", "action_mask", "gamma", "lambd")),
    ("openrlhf.trainer.ppo_utils.experience_maker", "RemoteExperienceMaker.get_cumulative_returns",
     ("self", "rewards", "action_mask", "gamma")),
)

_MARK = "__r3rag_per_step__"


class _Batch:
    """One ``compute_advantages_and_returns`` call: its experiences and, once computed, the shaping."""

    def __init__(self, experiences: list, estimator: str, n_per_prompt: int, min_std: float):
        self.experiences, self.estimator, self.n, self.min_std = experiences, estimator, n_per_prompt, min_std
        self.rows: dict[int, tuple[Any, ...]] | None = None  # id(action_mask) -> (experience, totals, scale, shift)

    def shaping_for(self, action_mask: torch.Tensor) -> tuple[Any, ...] | None:
        if self.rows is None:
            self.rows = self._shape()
        return self.rows.get(id(action_mask))

    def _shape(self) -> dict[int, tuple[Any, ...]]:
        from r3rag.train.rl.estimators import ESTIMATORS, shaping

        if self.estimator not in ESTIMATORS:
            raise RuntimeError(f"r3rag per-step hook: OpenRLHF estimator {self.estimator!r} has no r3rag shaping "
                               "(r3rag.train.rl.estimators.ESTIMATORS); run without the hook (R3RAG_PER_STEP=0) or add it")
        totals, index, kept, sizes = [], [], [], []
        for exp in self.experiences:
            r = exp.rewards.detach().float().cpu().reshape(-1)
            drop = exp.info.get(DROP_KEY)
            drop = torch.zeros_like(r, dtype=torch.bool) if drop is None else drop.detach().cpu().reshape(-1) > 0.5
            acts = exp.action_mask.detach().cpu().reshape(r.numel(), -1).sum(dim=1) > 0
            totals.append(r)
            index.append(torch.as_tensor(list(exp.index), dtype=torch.long).reshape(-1))
            kept.append(acts & ~drop)
            sizes.append(r.numel())
        t, ix, k = torch.cat(totals), torch.cat(index), torch.cat(kept)
        sh = shaping(self.estimator, t, ix // max(self.n, 1), kept=k, min_std=self.min_std)
        out, start = {}, 0
        for exp, size in zip(self.experiences, sizes):
            sl = slice(start, start + size)
            out[id(exp.action_mask)] = (exp, t[sl], sh.scale[sl], sh.shift[sl])
            start += size
        return out


_BATCH: list[_Batch] = []  # the call in progress (a stack: calls do not nest in practice)


def min_group_std(environ: Any = None) -> float:
    """The vanishing-spread guard's threshold: ``R3RAG_MIN_GROUP_STD`` or the single machine's default."""
    import os

    from r3rag.train.rl.estimators import MIN_STD

    value = (os.environ if environ is None else environ).get(ENV_MIN_STD)
    return MIN_STD if value in (None, "") else float(value)


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


def _wrap_process(orig):
    @functools.wraps(orig)
    def wrapper(self, response, *args, **kwargs):
        return attach(orig(self, response, *args, **kwargs), response)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_advantages(orig):
    @functools.wraps(orig)
    def wrapper(self, experiences, *args, **kwargs):
        a = self.strategy.args
        _BATCH.append(_Batch(list(experiences), a.algo.advantage.estimator, int(a.rollout.n_samples_per_prompt),
                             min_group_std()))
        try:
            return orig(self, experiences, *args, **kwargs)
        finally:
            _BATCH.pop()
            for exp in experiences:
                exp.info.pop(STEP_KEY, None)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_compute_reward(orig):
    @functools.wraps(orig)
    def wrapper(r, kl_coef, kl, action_mask=None, reward_clip_range=None):
        found = _BATCH[-1].shaping_for(action_mask) if _BATCH and action_mask is not None else None
        if found is None or isinstance(kl, list):
            return orig(r, kl_coef, kl, action_mask=action_mask, reward_clip_range=reward_clip_range)
        exp, totals, scale, shift = found
        dense = exp.info.get(STEP_KEY)
        dense = None if dense is None else dense.to(kl.device)
        return token_rewards(totals, dense, scale, shift, kl_coef, kl, action_mask, reward_clip_range)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_gae(orig):
    @functools.wraps(orig)
    def wrapper(self, values, rewards, action_mask, gamma, lambd, *args, **kwargs):
        if action_mask is None:
            return orig(self, values, rewards, action_mask, gamma, lambd, *args, **kwargs)
        pv, pm, order = pack_actions(values, action_mask)
        pr, _, _ = pack_actions(rewards, action_mask)
        adv, ret = orig(self, pv, pr, pm, gamma, lambd, *args, **kwargs)
        return unpack_actions(adv, action_mask, order), unpack_actions(ret, action_mask, order)

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_cumulative(orig):
    @functools.wraps(orig)
    def wrapper(self, rewards, action_mask, gamma, *args, **kwargs):
        if action_mask is None:
            return orig(self, rewards, action_mask, gamma, *args, **kwargs)
        pr, pm, order = pack_actions(rewards, action_mask)
        return unpack_actions(orig(self, pr, pm, gamma, *args, **kwargs), action_mask, order)

    setattr(wrapper, _MARK, True)
    return wrapper


def install() -> bool:
    """Wrap the five functions (idempotent). Returns False when they were already wrapped.
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
    em.get_advantages_and_returns = _wrap_gae(em.get_advantages_and_returns)
    em.get_cumulative_returns = _wrap_cumulative(em.get_cumulative_returns)
    experience_maker.compute_reward = _wrap_compute_reward(experience_maker.compute_reward)
    return True


def installed() -> bool:
    try:
        from openrlhf.trainer.ppo_utils import samples_generator
    except ImportError:
        return False
    return bool(getattr(samples_generator.SamplesGenerator._process_response_into_experience, _MARK, False))
