"""Losses of the RL update, all averaged over *generated* tokens only.

Token-level averaging: each loss is ``sum(per_token * action_mask) / num_tokens`` where
``num_tokens`` is the number of generated tokens in the **whole** rollout batch, so summing the
micro-batches' losses gives the batch's token mean (gradient accumulation by token budget changes
nothing). Prompt tokens, retrieved documents and padding have ``action_mask = 0``: they take no
part in any loss and receive exactly zero gradient through it.

- :func:`policy_loss`: PPO's clipped ratio (asymmetric ``clip_eps_low/high``, optional dual clip),
  ``ratio = exp(clamp(logp - old_logp, -20, 20))``, the loss ``-min(ratio A, clip(ratio) A)``;
- :func:`approx_kl`: Schulman's estimators of KL(policy || reference) per token:
  ``k1 = log r``, ``k2 = (log r)^2 / 2``, ``k3 = exp(-log r) - 1 + log r`` with
  ``log r = logp - ref_logp``, clamped to [-10, 10] (used in the reward or as a loss term); k3
  clamps ``log r`` at -10 before ``exp`` (as OpenRLHF): below that k3 is past the cap anyway, and
  ``exp(89)`` overflows float32, whose infinite derivative times the clamp's zero is a NaN gradient;
- :func:`value_loss`: ``0.5 * max((V_clip - R)^2, (V - R)^2)`` (clipped around the rollout's values);
- :func:`entropy_from_logits`: the entropy of the sampling distribution (a bonus when its
  coefficient is > 0).

These are the definitions of OpenRLHF's ``PolicyLoss``, ``compute_approx_kl``, ``ValueLoss`` and
``aggregate_loss`` (token-level mode), checked against them in tests/test_rl_openrlhf_parity.py.
"""

from __future__ import annotations

import torch


def masked_sum_mean(x: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """``sum(x * mask) / num_tokens`` (``num_tokens`` defaults to ``mask.sum()``)."""
    n = mask.sum() if num_tokens is None else num_tokens
    return (x * mask).sum() / n


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Log-prob of each label under ``softmax(logits / T)``; ``T <= 0`` (greedy) uses raw logits.

    ``logits`` ``(..., V)``, ``labels`` ``(...)``; ``temperature`` a float or a tensor broadcastable
    to ``labels``. Computed in float32."""
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
        logits = logits / t[..., None]
    elif temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits, -1, labels[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``H = logsumexp(z) - sum(softmax(z) * z)`` per position."""
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(dim=-1)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-ratio loss (token mean) and ``{clip_frac, ppo_kl}`` for logging."""
    log_ratio = logp - old_logp
    ratio = log_ratio.clamp(-20.0, 20.0).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    clipped = torch.min(surr1, surr2)
    if dual_clip is not None:
        clipped = torch.where(advantages < 0, torch.max(clipped, dual_clip * advantages), clipped)
    loss = masked_sum_mean(-clipped, mask, num_tokens)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((surr2 < surr1).float() * mask).sum() / n),
            "ppo_kl": float((-log_ratio * mask).sum() / n),
        }
    return loss, stats


def approx_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate (k1 | k2 | k3), clamped to [-10, 10]."""
    lr = logp.float() - ref_logp.float()
    if estimator == "k1":
        kl = lr
    elif estimator == "k2":
        kl = lr**2 / 2.0
    elif estimator == "k3":
        lr3 = lr.clamp(min=-10)
        kl = (-lr3).exp() - 1 + lr3
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")
    return kl.clamp(min=-10, max=10)


def kl_loss(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str, num_tokens: float | None = None) -> torch.Tensor:
    """KL as a loss term (token mean); multiply by the coefficient outside."""
    return masked_sum_mean(approx_kl(logp, ref_logp, estimator), mask, num_tokens)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               num_tokens: float | None = None, clip: float | None = None) -> torch.Tensor:
    if clip is not None:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.max((v_clip - returns) ** 2, (values - returns) ** 2)
    else:
        loss = (values - returns) ** 2
    return 0.5 * masked_sum_mean(loss, mask, num_tokens)
