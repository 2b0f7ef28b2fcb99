"""A tiny random causal LM with a real byte-level BPE tokenizer and a ChatML chat template.

Built in about a second, offline, for tests and ``--quick`` benchmarks: the tokenizer is trained
with ``tokenizers`` on a few lines of text (plus the format markers), wrapped in
``PreTrainedTokenizerFast``; the model is a Llama or Qwen2 config with hidden size 64 and 2 layers.
The chat template renders ``tool`` messages the way Qwen's does (a user turn wrapping
``<tool_response>``), so chat-mode tests exercise the same shape as the real SFT data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_TRAINING_TEXT = [
    "Step 1:\nThe problem analysis: we need the birthplace.\nThe retrieval query: where was he born",
    "The retrieval documents:\n(1) Varnel Oskaro: Varnel Oskaro was born in Quessa in 1874.",
    "Step 2:\nThe problem analysis: found it.\nThe final answer: Quessa",
    "<think> I need a fact <|begin_of_query|> founder of Melvane <|end_of_query|>",
    "<|begin_of_documents|>\n(1)Melvane Works was founded by Tirra Olle.\n<|end_of_documents|>",
    "</think>\n<answer> Tirra Olle </answer>",
    "The question: Who directed the film that won the Orvane prize in 1931?",
    "You answer questions by thinking one step at a time and searching a document collection.",
    "the a of in was by and to is for on with as at from that which who where when what year",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 1874 1931 2001 January March",
]


def build_tiny_tokenizer(vocab_size: int = 600, extra_text: list[str] | None = None) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TRAINING_TEXT * 4 + list(extra_text or []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


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
