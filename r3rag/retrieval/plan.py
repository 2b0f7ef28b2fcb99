"""What a dense index build and its server will need: disk, RAM, GPU memory, time.

:func:`plan` turns a corpus size, a vector dimension and a faiss factory string into bytes and
seconds with the model below. Sizes are arithmetic on the layouts (exact); times come from the
per-unit constants in :data:`MEASURED`, each measured by ``benchmark/perf/index_scale.py`` on
the CPU named in its ``source``, and from :data:`ASSUMED` for what this project could not
measure (GPU rates), which the output marks as assumed.

Model (n vectors of d dimensions, t tokens a passage):

- vectors on disk: n x d x 2 bytes (fp16 shards), read back for exact re-scoring;
- index bytes per vector: Flat 4d; SQfp16 2d; SQ8 d; HNSW<M> the storage plus 8M + 16 bytes of
  graph (2M level-0 links of 4 bytes, ~1 upper-level link, offsets and level); IVF<L>,PQ<m>[x<b>]
  m x b / 8 code bytes + 8 id bytes, plus L x d x 4 of centroids and 2^b x d x 4 of PQ tables;
- encoding: FLOPs = 2 x 12 x layers x hidden^2 per token (a BERT layer's weights), so e5-base
  (12 x 768) costs 8.0x MiniLM-L6 (6 x 384) a token; CPU time = tokens / (measured MiniLM tokens/s
  / that ratio) / cores; GPU time = FLOPs / (peak x assumed utilisation);
- IVF training: k-means over the sample, proportional to sample x L x d (measured constant);
  adding: proportional to n x (L + 2^b) x d (coarse assignment + PQ encoding); HNSW adding:
  proportional to n x d x log2(n); CPU figures are divided by the cores given (linear scaling
  assumed: faiss parallelises these loops with OpenMP);
- search (CPU, one thread, page cache warm): IVF-PQ time per query = L x d x (coarse MAC) +
  nprobe x (n / L) x code bytes x (per scanned byte: 8-bit PQ, or 4-bit fast-scan ``x4fs``) +
  refine_k x (per re-scored row), each constant measured;
- serving RAM: the codes/graph/vectors the layout keeps (memory-mapped files count in full, as
  they stay in the page cache once touched), the encoder, 8 bytes a passage of line offsets and
  the Python runtime; the fp16 vectors used for re-scoring are *not* counted: only refine_k rows
  per query are read from them (1.5 KB each at 768-d).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from r3rag.errors import R3RagError

GB = 1e9

# Measured on this project's CPU (AMD EPYC, 2 cores shared, AVX-512, no AMX; one faiss/torch thread)
# by benchmark/perf/index_scale.py on 2026-12-07; see docs/results/index_scale.md for the runs.
MEASURED: dict[str, dict] = {
    "minilm_cpu_tokens_per_s": {"value": 2285.0, "source": "index_scale.py: MiniLM-L6 fp32, 1 torch thread, 2,522,165 "
                                "tokens in 1,104 CPU-seconds (100k Wikipedia windows)"},
    "tokens_per_100_words": {"value": 137.0, "source": "index_scale.py: BERT uncased WordPiece (e5's and MiniLM's "
                             "vocabulary) on 100-word Wikipedia windows with title and 'passage: '"},
    "encode_rss_bytes_minilm": {"value": 0.72e9, "source": "index_scale.py: peak RSS of the encode, 696 MB after 10k "
                                "passages, 720 MB after 100k"},
    "runtime_rss_bytes": {"value": 0.5e9, "source": "retrieval.py run A: server peak RSS with a 200k x 384 Flat "
                          "(894 MB) less its 293 MB of vectors, MiniLM weights included"},
    "kmeans_s_per_unit": {"value": 1.46e-9, "source": "index_scale.py: IVF1024,PQ48 training seconds / (sample x "
                          "lists x d), 39,936 x 1,024 x 384, 1 thread"},
    "ivf_add_s_per_unit": {"value": 9.44e-11, "source": "index_scale.py: IVF1024,PQ48 add seconds / (n x (lists + "
                           "256) x d), 100k x 384, 1 thread"},
    "hnsw_add_s_per_unit": {"value": 5.87e-8, "source": "index_scale.py: HNSW32 build seconds / (n x d x log2 n), "
                            "100k x 384, 1 thread"},
    "coarse_s_per_mac": {"value": 5.69e-10, "source": "index_scale.py: Flat search seconds / (queries x n x d), "
                         "100k x 384, batches of 64, 1 thread"},
    "scan_s_per_code_byte": {"value": 1.36e-9, "source": "index_scale.py: IVF1024,PQ48 search at nprobe 256 less "
                             "the coarse step, per scanned code byte, 1 thread"},
    "fastscan_s_per_code_byte": {"value": 1.0e-10, "source": "index_scale.py: IVF1024,PQ96x4fs search at nprobe 256 "
                                 "less the coarse step, per scanned code byte, 1 thread"},
    "refine_s_per_row": {"value": 3.64e-6, "source": "index_scale.py: IVF1024,PQ96x4fs nprobe 256, refine 100 less "
                         "refine 0, per re-scored row (fp16 shards memory-mapped, page cache warm)"},
}
ASSUMED: dict[str, dict] = {
    "gpu_peak_flops": {"value": 989e12, "source": "H100 SXM dense fp16/bf16 peak (vendor datasheet)"},
    "gpu_utilisation": {"value": 0.25, "source": "assumed fraction of peak for BERT-base inference at batch 256; "
                                                  "measure yours with --stage encode on a slice and pass --encode-rate"},
    "gpu_encode_bytes": {"value": 4e9, "source": "assumed: fp16 weights + activations at batch 256 x 512 tokens"},
}


def constants() -> dict[str, dict]:
    """Every constant with its value and where it came from."""
    return {**MEASURED, **ASSUMED}


def value(name: str) -> float:
    return float(constants()[name]["value"])


@dataclass(frozen=True)
class Layout:
    kind: str  # flat, sq, hnsw, ivfpq, ivfflat
    storage_bytes: float  # bytes per vector of stored vectors/codes (without ids / links)
    hnsw_m: int = 0
    lists: int = 0
    pq_m: int = 0
    pq_bits: int = 8
    fastscan: bool = False


_IVF = re.compile(r"^(?:OPQ\d+(?:_\d+)?,)?IVF(\d+)(?:_HNSW\d+)?,(PQ(\d+)(?:x(\d+))?(fs|np)?|Flat|SQfp16|SQ8)$")
_HNSW = re.compile(r"^HNSW(\d+)(?:,(Flat|SQfp16|SQ8|PQ(\d+)))?$")


def parse_factory(factory: str, dim: int) -> Layout:
    """Bytes-per-vector model of a factory string (the layouts this project documents)."""
    f = factory.replace(" ", "")
    if f == "Flat":
        return Layout("flat", 4 * dim)
    if f in ("SQfp16", "SQ8"):
        return Layout("sq", (2 if f == "SQfp16" else 1) * dim)
    m = _HNSW.match(f)
    if m:
        store = {None: 4 * dim, "Flat": 4 * dim, "SQfp16": 2 * dim, "SQ8": dim}.get(m.group(2), None)
        if store is None:
            store = int(m.group(3))
        return Layout("hnsw", store, hnsw_m=int(m.group(1)))
    m = _IVF.match(f)
    if m:
        lists = int(m.group(1))
        if m.group(3):
            pq_m, bits = int(m.group(3)), int(m.group(4) or 8)
            return Layout("ivfpq", pq_m * bits / 8, lists=lists, pq_m=pq_m, pq_bits=bits, fastscan=m.group(5) == "fs")
        store = {"Flat": 4 * dim, "SQfp16": 2 * dim, "SQ8": dim}[m.group(2)]
        return Layout("ivfflat", store, lists=lists)
    raise R3RagError(f"--plan knows Flat, SQfp16, SQ8, HNSW<M>[,SQfp16|,SQ8|,PQ<m>], IVF<L>,PQ<m>[x<bits>] and "
                     f"IVF<L>,Flat|SQfp16|SQ8, not {factory!r}")


def index_bytes(n: int, dim: int, layout: Layout) -> float:
    if layout.kind in ("flat", "sq"):
        return n * layout.storage_bytes
    if layout.kind == "hnsw":
        return n * (layout.storage_bytes + 8 * layout.hnsw_m + 16)
    extra = layout.lists * dim * 4
    if layout.kind == "ivfpq":
        extra += (1 << layout.pq_bits) * dim * 4
    return n * (layout.storage_bytes + 8) + extra


def build_requirements(n: int, dim: int, factory: str, vectors_dtype: str = "float16",
                       train_size: int = 65536) -> dict:
    """Disk and RAM of the index stage (used by the builder's checks before it starts)."""
    layout = parse_factory(factory, dim)
    idx = index_bytes(n, dim, layout)
    block = 65536 * dim * 4
    train = min(train_size, n) * dim * 4 * 2 if layout.kind.startswith("ivf") or layout.pq_m else 0
    build_ram = idx + block + train + value("runtime_rss_bytes")
    if layout.kind in ("flat", "sq", "hnsw"):
        lower = ("the whole index is built in memory: use --fp16, an IVF<L>,PQ<m> --factory "
                 "(tool/build_index.py --plan shows its size), or a machine with more RAM")
    else:
        lower = "lower --train-size, or use fewer bytes per vector (PQ<m> with a smaller m)"
    return {"index_disk_bytes": int(idx), "build_ram_bytes": int(build_ram), "lower_ram_with": lower,
            "lower_disk_with": "free space or pick another --out", "layout": layout}


def flops_per_token(layers: int, hidden: int) -> float:
    return 2 * 12 * layers * hidden * hidden


def encoder_shape(dim: int, model: str | None = None) -> tuple[int, int, str]:
    """(layers, hidden, name) from a model folder's config.json, else the usual model of ``dim``."""
    if model and (Path(model) / "config.json").is_file():
        cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        return int(cfg.get("num_hidden_layers", 12)), int(cfg.get("hidden_size", dim)), Path(model).name
    return {384: (6, 384, "MiniLM-L6 / bge-small"), 768: (12, 768, "e5-base / bge-base (BERT-base)"),
            1024: (24, 1024, "e5-large / bge-large")}.get(dim, (12, dim, f"BERT-like, hidden {dim}"))


def default_nprobe(lists: int) -> int:
    """IVF lists searched per query by default: one in eight (at least 16). On the 100k real
    MiniLM vectors with question queries, one in sixteen gave recall@5 0.95 after re-scoring and
    one in eight 0.976 (docs/results/index_scale.md)."""
    return max(16, lists // 8)


def plan(n: int, dim: int, factory: str, gpus: int = 0, cpu_cores: int = 16, words_per_passage: float = 100.0,
         model: str | None = None, nprobe: int | None = None, refine_k: int = 100, train_size: int | None = None,
         encode_rate: float | None = None, corpus_bytes: float | None = None) -> dict:
    """Disk, RAM, GPU memory and time of building and serving ``factory`` over ``n`` passages."""
    layout = parse_factory(factory, dim)
    if nprobe is None:
        nprobe = default_nprobe(layout.lists) if layout.lists else 0
    layers, hidden, enc_name = encoder_shape(dim, model)
    if train_size is None:
        train_size = min(n, max(65536, 39 * layout.lists)) if layout.lists else 0
    tokens = value("tokens_per_100_words") * words_per_passage / 100.0
    fpt = flops_per_token(layers, hidden)
    minilm_fpt = flops_per_token(6, 384)
    cpu_rate_tokens = value("minilm_cpu_tokens_per_s") * minilm_fpt / fpt  # one core
    if encode_rate:
        enc_rate, enc_how = encode_rate, "given (--encode-rate)"
    elif gpus:
        enc_rate = gpus * value("gpu_peak_flops") * value("gpu_utilisation") / (fpt * tokens)
        enc_how = f"assumed: {gpus} GPU(s) at {value('gpu_utilisation'):.0%} of {value('gpu_peak_flops') / 1e12:.0f} TFLOP/s"
    else:
        enc_rate = cpu_cores * cpu_rate_tokens / tokens
        enc_how = f"measured MiniLM rate on this project's CPU, scaled by FLOPs to {enc_name}, x {cpu_cores} cores"
    idx = index_bytes(n, dim, layout)
    vectors = n * dim * 2
    offsets = 8 * (n + 1)
    corpus = corpus_bytes if corpus_bytes is not None else n * words_per_passage * 6.2
    enc_weights = 4 * (layers * 12 * hidden * hidden + 30522 * hidden)
    # build time of the index stage (CPU)
    if layout.kind in ("ivfpq", "ivfflat"):
        t_train = value("kmeans_s_per_unit") * train_size * layout.lists * dim
        pq_k = (1 << layout.pq_bits) if layout.kind == "ivfpq" else 0
        t_add = value("ivf_add_s_per_unit") * n * (layout.lists + pq_k) * dim
    elif layout.kind == "hnsw":
        t_train = 0.0
        t_add = value("hnsw_add_s_per_unit") * n * dim * math.log2(max(n, 2)) * layout.hnsw_m / 32
    else:
        t_train, t_add = 0.0, n * dim * 4 / 1e9  # memory copy, ~1 GB/s from disk
    t_train /= cpu_cores
    t_add /= cpu_cores
    # search per query on one CPU thread (warm page cache)
    if layout.kind in ("ivfpq", "ivfflat"):
        codes = nprobe * n / layout.lists
        per_code = layout.storage_bytes * value("fastscan_s_per_code_byte" if layout.fastscan else "scan_s_per_code_byte")
        t_q = value("coarse_s_per_mac") * layout.lists * dim + codes * per_code + refine_k * value("refine_s_per_row")
    elif layout.kind == "hnsw":
        t_q = None
    else:
        t_q = value("coarse_s_per_mac") * n * dim
    # faiss-gpu copies Flat/SQ (as fp16), IVF-Flat and 8-bit IVF-PQ; not HNSW nor 4-bit fast-scan
    gpu_ok = layout.kind in ("flat", "sq", "ivfflat") or (layout.kind == "ivfpq" and not layout.fastscan)
    gpu_all = (n * dim * 2 if layout.kind in ("flat", "sq") else idx) if gpus and gpu_ok else None
    refine_on = layout.kind == "ivfpq" or "SQ8" in factory or (layout.kind == "hnsw" and layout.pq_m > 0)
    serve_ram = idx + offsets + enc_weights + value("runtime_rss_bytes")
    build_ram = build_requirements(n, dim, factory, train_size=train_size or 65536)["build_ram_bytes"]
    encode_ram = value("encode_rss_bytes_minilm") + enc_weights
    return {
        "passages": n, "dim": dim, "factory": factory, "encoder": enc_name, "gpus": gpus, "cpu_cores": cpu_cores,
        "disk": {"vectors_fp16": vectors, "index": idx, "offsets": offsets, "corpus_jsonl": corpus,
                 "total": vectors + idx + offsets + corpus},
        "ram": {"encode_per_process": encode_ram, "index_build": build_ram, "serve": serve_ram,
                "serve_without_refine_vectors": serve_ram, "refine_reads_per_query": refine_k * dim * 2 if refine_on else 0},
        "gpu_memory": {"encode_per_gpu": value("gpu_encode_bytes") if gpus else 0,
                       "search_all_gpus_fp16": gpu_all, "search_per_gpu_fp16": gpu_all / gpus if gpus and gpu_all else None},
        "time_s": {"encode": n / enc_rate, "train": t_train, "add": t_add,
                   "search_per_query_1_thread": t_q},
        "encode_rate_passages_per_s": enc_rate, "encode_rate_how": enc_how,
        "tokens_per_passage": tokens, "train_size": train_size, "nprobe": nprobe,
        "refine_k": refine_k if refine_on else 0,
    }


def _fmt_bytes(b: float) -> str:
    return f"{b / GB:,.1f} GB" if b >= 0.1 * GB else f"{b / 1e6:,.0f} MB"


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 1:
        return f"{s * 1000:.2f} ms"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def format_plan(p: dict) -> str:
    """A human-readable table of :func:`plan`'s result (all figures projected)."""
    d, r, g, t = p["disk"], p["ram"], p["gpu_memory"], p["time_s"]
    where = f"{p['gpus']} GPU(s)" if p["gpus"] else f"{p['cpu_cores']} CPU cores"
    lines = [
        f"plan (projected): {p['passages']:,} passages x {p['dim']}-d, {p['factory']}, encoder {p['encoder']}, "
        f"encoding on {where}",
        f"  disk   vectors (fp16) {_fmt_bytes(d['vectors_fp16'])} + index {_fmt_bytes(d['index'])} + "
        f"offsets {_fmt_bytes(d['offsets'])} (+ corpus {_fmt_bytes(d['corpus_jsonl'])}) = {_fmt_bytes(d['total'])}",
        f"  RAM    encode {_fmt_bytes(r['encode_per_process'])} per process (flat in corpus size); "
        f"index build {_fmt_bytes(r['index_build'])}; serve {_fmt_bytes(r['serve'])}"
        + (f" (+ {p['refine_k']} fp16 rows read per query for exact re-scoring)" if p["refine_k"] else ""),
    ]
    if p["gpus"]:
        search = (f"--faiss-gpu search {_fmt_bytes(g['search_per_gpu_fp16'])} per GPU "
                  f"({_fmt_bytes(g['search_all_gpus_fp16'])} in all, fp16, sharded)" if g["search_all_gpus_fp16"]
                  else "--faiss-gpu: faiss-gpu has no GPU version of this layout (use Flat or IVF<L>,PQ<m> for GPU search)")
        lines.append(f"  GPU    encode ~{_fmt_bytes(g['encode_per_gpu'])} per GPU (assumed); {search}")
    lines += [
        f"  time   encode {_fmt_s(t['encode'])} at {p['encode_rate_passages_per_s']:,.0f} passages/s "
        f"({p['tokens_per_passage']:.0f} tokens each; {p['encode_rate_how']})",
        f"         index build on {p['cpu_cores']} CPU cores: train {_fmt_s(t['train'])}"
        + (f" ({p['train_size']:,} vectors)" if p["train_size"] else "") + f", add {_fmt_s(t['add'])}",
        f"         search {_fmt_s(t['search_per_query_1_thread'])} per query per CPU thread"
        + (f" (nprobe {p['nprobe']}, refine {p['refine_k']})" if p["refine_k"] else "")
        + " plus the query encoding",
        "  constants: " + "; ".join(f"{k} = {v['value']:g} ({v['source']})" for k, v in constants().items()
                                    if k in ("minilm_cpu_tokens_per_s", "tokens_per_100_words"))
        + "; see `r3rag.retrieval.plan` for every constant and its source",
    ]
    return "\n".join(lines)
