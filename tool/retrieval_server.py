#!/usr/bin/env python
"""Serve one or more retrieval indexes over HTTP (FastAPI + uvicorn).

Endpoints: POST /retrieve (Search-R1, verl), POST /search (R3-RAG), POST /queries (R1-Searcher),
GET /health, GET /stats. Binds 127.0.0.1 unless --host says otherwise. Under overload a request
past --max-queue waiting requests for its index is answered 503 with Retry-After at once.

Examples:
  python tool/retrieval_server.py --index indexes/bm25
  python tool/retrieval_server.py --index bm25=indexes/bm25 --index dense=indexes/minilm --hybrid --port 8001
  python tool/retrieval_server.py --index indexes/bm25 --max-queue 64 --limit-concurrency 512
  python tool/retrieval_server.py --index e5=indexes/e5-ivfpq --nprobe 64 --refine-k 100   # wiki18 in < 8 GB
  python tool/retrieval_server.py --index e5=indexes/e5-flat --faiss-gpu                 # all GPUs, fp16, sharded
"""

from __future__ import annotations

import argparse
import logging

from r3rag.cli import ArgumentParser, run_main
from r3rag.config import add_config_args, load_config
from r3rag.retrieval.config import ServiceConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", action="append", required=True, metavar="[NAME=]DIR",
                   help="index directory from tool/build_index.py (repeatable)")
    p.add_argument("--host", help="bind address (default 127.0.0.1; use 0.0.0.0 to expose deliberately)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--hybrid", action="store_true", help="also serve 'hybrid': reciprocal rank fusion of all indexes")
    p.add_argument("--reranker", help="cross-encoder folder to rerank every index's candidates")
    p.add_argument("--no-microbatch", action="store_true", help="search each request alone (for comparison)")
    p.add_argument("--cache-size", type=int, help="LRU cache entries (0 disables)")
    p.add_argument("--torch-threads", type=int, help="torch intra-op threads for query encoding")
    p.add_argument("--max-queue", type=int,
                   help="requests an index may hold (waiting or searched) before answering 503 + Retry-After "
                        "(default 256; 0 = unbounded)")
    p.add_argument("--retry-after", type=int, help="seconds in the Retry-After header of those 503s (default 1)")
    p.add_argument("--limit-concurrency", type=int,
                   help="uvicorn's cap on connections + in-flight requests; past it every path gets 503 "
                        "(default 1024; 0 = no cap)")
    g = p.add_argument_group("large indexes")
    g.add_argument("--faiss-gpu", action="store_true",
                   help="copy dense indexes to every visible GPU (faiss-gpu, sharded, fp16)")
    g.add_argument("--no-mmap", action="store_true", help="read dense index files into memory instead of mapping them")
    g.add_argument("--bm25-mmap", action="store_true", help="memory-map the BM25 score matrix")
    g.add_argument("--refine-k", type=int, help="candidates re-scored exactly from the stored fp16 vectors (default: the manifest's)")
    g.add_argument("--nprobe", type=int, help="IVF lists searched per query (default: the manifest's)")
    g.add_argument("--ef-search", type=int, help="HNSW search breadth (default: the manifest's)")
    g.add_argument("--encoder", help="encoder folder to use instead of the manifest's (checked against the index)")
    add_config_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides)
    for key, value in (("host", args.host), ("port", args.port), ("reranker", args.reranker),
                       ("cache_size", args.cache_size), ("torch_threads", args.torch_threads),
                       ("max_queue", args.max_queue), ("retry_after_s", args.retry_after),
                       ("limit_concurrency", args.limit_concurrency), ("refine_k", args.refine_k),
                       ("nprobe", args.nprobe), ("ef_search", args.ef_search), ("dense_encoder", args.encoder)):
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.hybrid:
        overrides.append("hybrid=true")
    if args.no_microbatch:
        overrides.append("microbatch=false")
    for flag, setting in ((args.faiss_gpu, "faiss_gpu=true"), (args.no_mmap, "dense_mmap=false"),
                          (args.bm25_mmap, "bm25_mmap=true")):
        if flag:
            overrides.append(setting)
    cfg = load_config(ServiceConfig, args.config, overrides)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    import uvicorn

    from r3rag.retrieval.service import create_app, load_searchers

    app = create_app(load_searchers(args.index, cfg), cfg)
    print(f"serving {', '.join(app.state.runtime.searchers)} on http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False, backlog=2048,
                limit_concurrency=cfg.limit_concurrency or None)
    return 0


if __name__ == "__main__":
    run_main(main)
