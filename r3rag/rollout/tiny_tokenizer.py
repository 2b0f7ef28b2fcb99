"""A small built-in tokenizer: byte-level BPE with ChatML specials and a ChatML chat template.

Built offline in about a second by training ``tokenizers``' BPE on a few lines of text that hold
every marker of both trajectory formats. Two users:

- the world's oracle policy writes text, not tokens, so it needs *a* tokenizer with a chat template
  but no particular model's (evaluation ``method oracle``, the demo's oracle policy, the oracle
  benchmark);
- tests and ``--quick`` benchmarks pair it with a tiny random model
  (:mod:`r3rag.testing.tiny_models`).

The chat template renders ``tool`` messages the way Qwen's does (a user turn wrapping
``<tool_response>``), so chat-mode tests exercise the same shape as the real SFT data.
"""

from __future__ import annotations

from typing import Any

#: the name under which :func:`r3rag.rollout.backends.hf_loading.load_tokenizer` builds this tokenizer
TINY_TOKENIZER = "tiny"

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
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML specials, chat template and pad token."""
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
