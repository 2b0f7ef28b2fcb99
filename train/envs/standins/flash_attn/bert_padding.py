"""Plain-torch versions of the padding helpers OpenRLHF imports from ``flash_attn.bert_padding``.

``unpad_input`` removes padded positions (attention mask 0) and returns the packed tokens, their
indices in the flattened batch, cumulative sequence lengths and the longest length;
``pad_input`` scatters packed rows back; ``index_first_axis`` gathers rows by index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange  # noqa: F401  (OpenRLHF imports it from here)


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1)[indices].reshape(indices.shape[0], *x.shape[1:])


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max().item()) if seqlens.numel() else 0, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype, device=hidden_states.device)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
