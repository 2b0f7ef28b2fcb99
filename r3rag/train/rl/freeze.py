"""Train only the top of the policy: ``model.trainable_layers: N``.

The policy's lower decoder layers and its embeddings are frozen (``requires_grad=False``); the top
``N`` decoder layers and the final norm train. Autograd then records nothing below the first
trainable layer: the lower layers' activations are not kept, the backward pass stops at layer
``L - N``, and the optimizer holds state for the trainable parameters only. The gradient of a
trainable parameter is exactly what it is when the whole model trains (the frozen layers' outputs
do not depend on it), so this changes which parameters move, not how the ones that move are
updated (``tests/test_rl_freeze.py``). Cost of an update on 2 CPU cores: ``benchmark/perf/rl_update.py``.

A model with tied input/output embeddings (SmolLM2) freezes its language-model head with the
embeddings; an untied head freezes too, so "top N layers" means the same thing for every model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from r3rag.errors import ConfigError
from r3rag.train.rl.forward import decoder_of


@dataclass(frozen=True)
class FrozenSplit:
    """What :func:`freeze_lower_layers` left trainable."""

    layers: int             # decoder layers in the model
    trainable_layers: int   # of them, counted from the top
    trainable_params: int
    total_params: int


def decoder_layers(model: Any) -> Any:
    """The decoder's list of transformer blocks (``model.model.layers`` for Llama/Qwen/SmolLM)."""
    try:
        layers = getattr(decoder_of(model), "layers", None)
    except AttributeError:
        layers = None
    if layers is None:
        raise ConfigError(f"model.trainable_layers: {type(model).__name__} has no decoder .layers list to freeze "
                          "(set model.trainable_layers: null to train the whole model)")
    return layers


def freeze_lower_layers(model: Any, n: int | None) -> FrozenSplit:
    """Freeze everything but the top ``n`` decoder layers and the final norm (in place).

    ``n`` None or at least the number of layers: nothing is frozen."""
    if n is not None and n < 1:
        raise ConfigError(f"model.trainable_layers must be at least 1 (or null for the whole model), got {n}")
    try:
        layers = decoder_layers(model)
    except ConfigError:
        if n is not None:
            raise
        layers = None  # nothing to freeze: any architecture trains whole
    total = sum(p.numel() for p in model.parameters())
    if layers is None or n is None or n >= len(layers):
        model.requires_grad_(True)
        count = len(layers) if layers is not None else 0
        return FrozenSplit(count, count, total, total)
    model.requires_grad_(False)
    for block in list(layers)[len(layers) - n:]:
        block.requires_grad_(True)
    norm = getattr(decoder_of(model), "norm", None)
    if norm is not None:
        norm.requires_grad_(True)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return FrozenSplit(len(layers), n, trainable, total)
