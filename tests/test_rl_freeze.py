"""model.trainable_layers: only the top N decoder layers train, with the gradients they would get
if the whole model trained; the frozen part stays bit-identical through a real RL iteration."""

from __future__ import annotations

import copy

import pytest
import torch

from r3rag.errors import ConfigError
from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer
from r3rag.train.rl.forward import policy_logprobs
from r3rag.train.rl.freeze import decoder_layers, freeze_lower_layers
from tests.rl_helpers import tiny_cfg, tiny_trainer


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 12), generator=g)            # (B, T)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0                                                # a left-padded row
    action = torch.zeros(3, 11)                                    # (B, T-1): generated positions only
    action[:, 6:] = 1
    action[1, 8] = 0                                               # a document token inside the generated span
    return ids, attn, action, torch.ones(3)


def _loss(model, ids, attn, action, temps) -> torch.Tensor:
    lp, _ = policy_logprobs(model, ids, attn, action, temps)      # (B, T-1)
    weights = torch.linspace(-1.0, 2.0, lp.shape[1])[None, :]      # different advantage per position
    return -(lp * weights * action).sum() / action.sum()


def test_trainable_layers_get_exactly_the_full_models_gradients_and_the_rest_none():
    tok = build_tiny_tokenizer()
    full = build_tiny_model(tok, layers=4, seed=3)
    part = copy.deepcopy(full)
    split = freeze_lower_layers(part, 1)
    assert (split.layers, split.trainable_layers) == (4, 1)
    assert 0 < split.trainable_params < split.total_params
    batch = _batch(len(tok))
    _loss(full, *batch).backward()
    _loss(part, *batch).backward()
    top = decoder_layers(part)[3]
    for (name, p_full), (_, p_part) in zip(full.named_parameters(), part.named_parameters()):
        trains = name.startswith("model.layers.3.") or name == "model.norm.weight"
        assert p_part.requires_grad is trains, name
        if trains:
            assert p_full.grad is not None and p_full.grad.abs().sum() > 0, name
            torch.testing.assert_close(p_part.grad, p_full.grad, rtol=1e-5, atol=1e-7)
        else:
            assert p_part.grad is None, name
    assert all(p.requires_grad for p in top.parameters())


def test_gradient_checkpointing_still_reaches_the_trainable_layers():
    """Recomputing activations (model.gradient_checkpointing) over frozen lower layers: the
    trainable blocks' gradients are those of the plain backward pass, none missing."""
    tok = build_tiny_tokenizer()
    ref = build_tiny_model(tok, layers=4, seed=4)
    ckpt = copy.deepcopy(ref)
    freeze_lower_layers(ref, 2)
    freeze_lower_layers(ckpt, 2)
    ckpt.train()
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = _batch(len(tok), seed=1)
    _loss(ref, *batch).backward()
    _loss(ckpt, *batch).backward()
    grads = {n: p.grad for n, p in ckpt.named_parameters() if p.requires_grad}
    assert set(grads) and all(g is not None for g in grads.values())
    for n, p in ref.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7)


def test_an_rl_iteration_moves_only_the_top_layers(tmp_path):
    cfg = tiny_cfg("group_norm", iterations=1)
    cfg.model.trainable_layers = 1
    tr = tiny_trainer(cfg, tmp_path)
    tr._build()
    before = {n: p.detach().clone() for n, p in tr.models.policy.named_parameters()}
    n_opt = sum(p.numel() for g in tr.optimizer.param_groups for p in g["params"])
    assert n_opt == tr.frozen.trainable_params < tr.frozen.total_params
    rec = tr.iteration(0)
    assert rec["batch/kept"] > 0 and rec["policy/grad_norm"] > 0
    moved = {n for n, p in tr.models.policy.named_parameters() if not torch.equal(p, before[n])}
    assert moved, "nothing trained"
    assert all(n.startswith("model.layers.1.") or n == "model.norm.weight" for n in moved), moved
    assert any(n.startswith("model.layers.1.") for n in moved)


def test_whole_model_by_default_and_clear_errors():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, layers=2)
    split = freeze_lower_layers(model, None)
    assert split.trainable_params == split.total_params and all(p.requires_grad for p in model.parameters())
    assert freeze_lower_layers(model, 5).trainable_params == split.total_params  # more than it has: the whole model
    with pytest.raises(ConfigError, match="at least 1"):
        freeze_lower_layers(model, 0)
    with pytest.raises(ConfigError, match="no decoder .layers"):
        freeze_lower_layers(torch.nn.Linear(2, 2), 1)
