"""Losses: prompt and document tokens get exactly zero gradient; token-level averaging; the
trainer's forward computes log-probs under the sampling temperature."""

from __future__ import annotations

import pytest
import torch

from r3rag.train.rl.forward import policy_logprobs
from r3rag.train.rl.losses import (
    approx_kl,
    entropy_from_logits,
    kl_loss,
    policy_loss,
    token_logprobs,
    value_loss,
)

V = 11
# (B=2, L=6) shifted axis; row 0: prompt(0), generated(1,2), documents(3,4), generated(5)
MASK = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 0]], dtype=torch.float32)


def leaves(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 6, V, generator=g).requires_grad_(True)  # (B, L, V)
    values = torch.randn(2, 6, generator=g).requires_grad_(True)  # (B, L)
    labels = torch.randint(0, V, (2, 6), generator=g)  # (B, L)
    return logits, values, labels, g


@pytest.mark.parametrize("which", ["policy", "policy_dual_clip", "kl_k1", "kl_k2", "kl_k3", "value", "entropy"])
def test_prompt_and_document_positions_get_exactly_zero_gradient(which):
    logits, values, labels, g = leaves()
    logp = token_logprobs(logits, labels)  # (B, L)
    old = logp.detach() + 0.05 * torch.randn(2, 6, generator=g)  # ratios inside the clip range
    adv = torch.randn(2, 6, generator=g) * 5
    adv[MASK == 0] = 1e6  # huge advantages off the mask must not leak
    ref = logp.detach() - 0.2
    n = float(MASK.sum())
    if which == "policy":
        loss, _ = policy_loss(logp, old, adv, MASK, n)
    elif which == "policy_dual_clip":
        loss, _ = policy_loss(logp, old, adv, MASK, n, dual_clip=3.0)
    elif which.startswith("kl_"):
        loss = kl_loss(logp, ref, MASK, which[3:], n)
    elif which == "value":
        loss = value_loss(values, values.detach() + 0.1, torch.randn(2, 6, generator=g), MASK, n, clip=0.2)
    else:
        loss = -(entropy_from_logits(logits) * MASK).sum() / n
    loss.backward()
    grad = values.grad if which == "value" else logits.grad
    per_pos = grad.abs().reshape(2, 6, -1).sum(-1)  # (B, L)
    assert torch.all(per_pos[MASK == 0] == 0.0)  # exactly zero, not small
    assert int((per_pos[MASK == 1] > 0).sum()) >= 5  # and the generated ones do get gradient


def test_token_level_average_is_over_the_whole_batch():
    # summing micro-batch losses each divided by the batch's token count == one big batch's token mean
    logits, _, labels, g = leaves(1)
    logp = token_logprobs(logits, labels).detach()
    old = logp - 0.1
    adv = torch.randn(2, 6, generator=g)
    whole, _ = policy_loss(logp, old, adv, MASK)
    n = float(MASK.sum())
    parts = sum(policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], MASK[i:i + 1], n)[0] for i in range(2))
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)
    per_token = -(torch.min((logp - old).exp() * adv, (logp - old).exp().clamp(0.8, 1.2) * adv) * MASK).sum() / MASK.sum()
    assert float(whole) == pytest.approx(float(per_token), rel=1e-6)


def test_kl_estimators_values():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -0.5])
    # log r = [0.5, -0.5]: k1 = log r; k2 = (log r)^2 / 2; k3 = exp(-log r) - 1 + log r
    assert approx_kl(lp, ref, "k1").tolist() == pytest.approx([0.5, -0.5])
    assert approx_kl(lp, ref, "k2").tolist() == pytest.approx([0.125, 0.125])
    assert approx_kl(lp, ref, "k3").tolist() == pytest.approx([0.1065307, 0.1487213], rel=1e-5)
    with pytest.raises(ValueError):
        approx_kl(lp, ref, "k4")


def test_trainer_forward_uses_the_sampling_temperature_and_only_generated_positions():
    from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok)
    ids = torch.randint(5, len(tok), (2, 7))  # (B, T)
    attn = torch.ones_like(ids)
    mask = MASK.clone()
    temps = torch.tensor([0.7, 0.0])  # row 1 greedy: raw logits
    with torch.no_grad():
        lp, ent = policy_logprobs(model, ids, attn, mask, temps, entropy=True)
        full = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
    want0 = torch.log_softmax(full[0] / 0.7, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    want1 = torch.log_softmax(full[1], -1).gather(-1, ids[1, 1:, None]).squeeze(-1)
    assert torch.allclose(lp[0][MASK[0] == 1], want0[MASK[0] == 1], atol=1e-5)
    assert torch.allclose(lp[1][MASK[1] == 1], want1[MASK[1] == 1], atol=1e-5)
    assert torch.all(lp[MASK == 0] == 0) and torch.all(ent[MASK == 0] == 0) and torch.all(ent[MASK == 1] > 0)
    # gradient reaches the LM head only through generated positions
    model.zero_grad()
    lp, _ = policy_logprobs(model, ids, attn, mask, temps)
    (lp * mask).sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


@pytest.mark.parametrize("log_ratio", [-89.0, -100.0, -1000.0])
def test_k3_gradient_is_finite_far_below_the_reference(log_ratio):
    """k3 clamps log r at -10 before exp (OpenRLHF does too): exp(89) overflows float32, and the
    clamp's zero derivative times an infinite one would be NaN."""
    logp = torch.tensor([log_ratio, -0.3, 0.0], requires_grad=True)
    ref = torch.zeros(3)
    kl = approx_kl(logp, ref, "k3")
    kl.sum().backward()
    assert torch.isfinite(kl).all() and kl[0].item() == 10.0
    assert torch.isfinite(logp.grad).all() and logp.grad[0].item() == 0.0
    assert logp.grad[1].item() == pytest.approx(1 - torch.exp(torch.tensor(0.3)).item(), rel=1e-5)
