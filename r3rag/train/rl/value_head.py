"""The critic for ``gae``: the policy's own architecture (a copy of its decoder) plus a scalar head.

``V(s_p)``, the value of the state after reading tokens ``0..p``, is read from the decoder's last
hidden state at position ``p`` through one linear layer, the same alignment as the policy's
logits: on the shifted axis, the value at ``p`` belongs to the action that produces token ``p+1``.
The decoder starts from the policy's weights and the head from zero (all values start at 0).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from r3rag.train.rl.forward import decoder_of


class ValueModel(nn.Module):
    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.decoder = copy.deepcopy(decoder_of(policy))
        hidden = int(policy.config.hidden_size)
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values on the shifted axis, ``(B, T-1)`` float32."""
        h = self.decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        return self.head(h).squeeze(-1).float()
