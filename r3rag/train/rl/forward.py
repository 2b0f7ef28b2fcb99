"""The trainer's forward pass: log-probs (and entropy) of generated tokens only.

The decoder runs over the whole padded sequence (documents and prompt are context), but the
language-model head, whose output is ``vocabulary``-wide, is applied only at the positions that
predict a generated token. With long prompts and documents this skips most of the head's work
and memory. Log-probs are under the distribution the rollout sampled from, ``softmax(logits / T)``
with the row's temperature (raw logits for greedy rows).
"""

from __future__ import annotations

from typing import Any

import torch

from r3rag.train.rl.losses import entropy_from_logits, token_logprobs


def decoder_of(model: Any) -> Any:
    """The transformer body of a causal LM (``model.model`` for Llama/Qwen-style classes)."""
    body = getattr(model, "model", None)
    if body is None:
        body = model.get_decoder()
    return body


def policy_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
    temperatures: torch.Tensor,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy)``, each ``(B, T-1)`` float32, zero where ``action_mask`` is 0."""
    h = decoder_of(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    sel = action_mask > 0
    logits = model.get_output_embeddings()(h[sel])  # (N, V): generated positions only
    t = temperatures.to(logits.device)[:, None].expand_as(sel)[sel]
    labels = input_ids[:, 1:][sel]
    lp = token_logprobs(logits, labels, t)
    out = torch.zeros(action_mask.shape, dtype=torch.float32, device=lp.device)
    out = out.masked_scatter(sel, lp)
    ent = None
    if entropy:
        scaled = logits.float() / torch.where(t > 0, t, torch.ones_like(t)).float()[:, None]
        ent = torch.zeros(action_mask.shape, dtype=torch.float32, device=lp.device).masked_scatter(sel, entropy_from_logits(scaled))
    return out, ent
