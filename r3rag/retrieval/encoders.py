"""Dense text encoders: any Hugging Face encoder folder, with the e5/bge/sbert conventions.

An encoder turns text into one L2-normalised vector: tokenise (truncating to ``max_length``),
run the transformer, pool the last hidden states (``mean`` over non-padding tokens, or the
``cls`` token), normalise. The conventions differ only in prefixes and pooling, so they are
data in :data:`FAMILIES`:

- ``e5``: ``"query: "`` / ``"passage: "`` prefixes, mean pooling;
- ``bge``: the query instruction ``"Represent this sentence for searching relevant passages: "``,
  no passage prefix, CLS pooling;
- ``sbert``: sentence-transformers folders (e.g. all-MiniLM-L6-v2): no prefixes, the pooling
  named in the folder's ``1_Pooling/config.json`` (mean if absent).

``auto`` picks sbert when the folder has ``modules.json``, else e5 or bge by name, else sbert.
Explicit ``pooling``/``query_prefix``/``passage_prefix`` override the family's values.

An index remembers which encoder made it by a *probe*: the passage vectors of
:data:`PROBE_TEXTS`, stored in its manifest. :meth:`Encoder.check_probe` encodes the same
texts again and compares by cosine similarity; a different model, pooling or prefix gives a
different direction (random pairs of vectors score near 0, the same model on another device or
in fp16 above 0.99), so serving an index with the wrong encoder is refused at load time instead
of returning plausible-looking nonsense.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from r3rag.errors import R3RagError

Kind = Literal["query", "passage"]


@dataclass(frozen=True)
class Family:
    query_prefix: str
    passage_prefix: str
    pooling: Literal["mean", "cls"]


BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
FAMILIES: dict[str, Family] = {
    "e5": Family(query_prefix="query: ", passage_prefix="passage: ", pooling="mean"),
    "bge": Family(query_prefix=BGE_QUERY_INSTRUCTION, passage_prefix="", pooling="cls"),
    "sbert": Family(query_prefix="", passage_prefix="", pooling="mean"),
}
FAMILY_CHOICES = ("auto", *FAMILIES)
PROBE_TEXTS = (
    "Paris\nParis is the capital and most populous city of France.",
    "Photosynthesis\nPlants convert light energy into chemical energy stored in glucose.",
)
PROBE_MIN_COSINE = 0.99


def _sbert_pooling(folder: Path) -> Literal["mean", "cls"] | None:
    cfg = folder / "1_Pooling" / "config.json"
    if not cfg.is_file():
        return None
    modes = json.loads(cfg.read_text(encoding="utf-8"))
    return "cls" if modes.get("pooling_mode_cls_token") else "mean"


def resolve_family(model: str, family: str = "auto") -> tuple[str, Family]:
    """The family name and conventions for ``model`` (a folder or hub name)."""
    if family != "auto":
        if family not in FAMILIES:
            raise R3RagError(f"unknown model family {family!r}; choose from {', '.join(FAMILY_CHOICES)}")
        fam = FAMILIES[family]
        if family == "sbert":
            pooling = _sbert_pooling(Path(model))
            fam = replace(fam, pooling=pooling) if pooling else fam
        return family, fam
    folder = Path(model)
    if (folder / "modules.json").is_file():
        return resolve_family(model, "sbert")
    lowered = folder.name.lower() if folder.name else model.lower()
    for name in ("e5", "bge"):
        if name in lowered:
            return name, FAMILIES[name]
    return "sbert", FAMILIES["sbert"]


def pool(hidden, mask, pooling: str):
    """Pool ``hidden`` (batch, seq, dim) with attention ``mask`` (batch, seq)."""
    if pooling == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class Encoder:
    """``Encoder(folder, family="auto").encode(texts, "query"|"passage") -> float32 (n, dim)``."""

    def __init__(
        self,
        model: str,
        family: str = "auto",
        pooling: str | None = None,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
        normalize: bool = True,
        fp16: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_name = str(model)
        self.family, fam = resolve_family(self.model_name, family)
        self.pooling = pooling or fam.pooling
        if self.pooling not in ("mean", "cls"):
            raise R3RagError(f"unknown pooling {self.pooling!r}; choose mean or cls")
        self.query_prefix = fam.query_prefix if query_prefix is None else query_prefix
        self.passage_prefix = fam.passage_prefix if passage_prefix is None else passage_prefix
        self.max_length = max_length
        self.batch_size = batch_size
        self.normalize = normalize
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            self.model = AutoModel.from_pretrained(self.model_name)
        except (OSError, ValueError) as err:
            raise R3RagError(f"cannot load encoder {self.model_name!r}: {str(err).splitlines()[0]}") from None
        self.model.eval().to(self.device)
        self.fp16 = bool(fp16 and self.device != "cpu")
        if self.fp16:
            self.model.half()
        self.dim = int(self.model.config.hidden_size)

    def prefix(self, kind: Kind) -> str:
        return self.query_prefix if kind == "query" else self.passage_prefix

    def encode(self, texts: list[str], kind: Kind = "query") -> np.ndarray:
        """Encode in batches of ``batch_size``; sorted by length inside the call to cut padding."""
        import torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prefix = self.prefix(kind)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = self.tokenizer(
                    [prefix + texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state
                vec = pool(hidden, batch["attention_mask"], self.pooling).float()
                if self.normalize:
                    vec = torch.nn.functional.normalize(vec, dim=-1)
                out[idx] = vec.cpu().numpy()
        return out

    def init_kwargs(self, device: str | None = None) -> dict:
        """Keyword arguments that rebuild this encoder (e.g. in a worker process on ``device``)."""
        return {"model": self.model_name, "family": self.family, "pooling": self.pooling,
                "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix,
                "max_length": self.max_length, "batch_size": self.batch_size, "normalize": self.normalize,
                "device": device or self.device, "fp16": self.fp16}

    def probe(self) -> list[list[float]]:
        """Passage vectors of :data:`PROBE_TEXTS` (rounded to 5 decimals), for the manifest."""
        return [[round(float(x), 5) for x in v] for v in self.encode(list(PROBE_TEXTS), "passage")]

    def check_probe(self, expected: list[list[float]], where: str, built_with: str) -> None:
        """Raise :class:`R3RagError` unless this encoder reproduces ``expected`` (an index's probe)."""
        if not expected:
            return
        want = np.asarray(expected, dtype=np.float32)
        if want.shape[1] != self.dim:
            raise R3RagError(f"{where}: built with {built_with} ({want.shape[1]}-d vectors) but the encoder "
                             f"{self.model_name} gives {self.dim}-d; serve it with the encoder it was built with")
        got = self.encode(list(PROBE_TEXTS), "passage")
        cos = float(np.min(np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1) + 1e-12)))
        if cos < PROBE_MIN_COSINE:
            raise R3RagError(f"{where}: built with {built_with}, but the encoder {self.model_name} "
                             f"(pooling {self.pooling}, passage prefix {self.passage_prefix!r}) encodes the probe "
                             f"passages differently (cosine {cos:.3f} < {PROBE_MIN_COSINE}); serve it with the "
                             "encoder it was built with")

    def settings(self) -> dict:
        return {
            "encoder": self.model_name,
            "family": self.family,
            "pooling": self.pooling,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "dim": self.dim,
        }
