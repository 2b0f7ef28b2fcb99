"""A tiny random causal LM paired with the library's built-in ChatML tokenizer.

Built in about a second, offline, for tests and ``--quick`` benchmarks: the tokenizer is
:func:`r3rag.rollout.tiny_tokenizer.build_tiny_tokenizer` (production code uses it too, for the
oracle, so it lives in the library and is re-exported here); the model is a Llama or Qwen2 config
with hidden size 64 and 2 layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r3rag.rollout.tiny_tokenizer import CHATML_TEMPLATE, SPECIAL_TOKENS, build_tiny_tokenizer

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "build_tiny_model", "build_tiny_tokenizer", "save_tiny_model"]


def build_tiny_model(tokenizer: Any, arch: str = "llama", hidden: int = 64, layers: int = 2, seed: int = 0) -> Any:
    """A randomly initialised causal LM sized for the tokenizer (``arch``: llama | qwen2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    cfg_cls, model_cls = classes[arch]
    cfg = cfg_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg)
    model.eval()
    return model


def save_tiny_model(out_dir: str | Path, arch: str = "llama", seed: int = 0) -> Path:
    """Build and save a tiny model + tokenizer folder (loadable with ``from_pretrained``)."""
    out = Path(out_dir)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, arch=arch, seed=seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
