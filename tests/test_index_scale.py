"""Building and serving large dense indexes: sharded resumable encoding, memory-mapped and GPU
search, exact re-scoring, the build's resource checks, and the refusals of mismatched inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from r3rag.errors import R3RagError
from r3rag.retrieval.dense_index import build_dense
from r3rag.retrieval.encoders import Encoder
from r3rag.retrieval.manifest import IndexError_
from r3rag.retrieval.searcher import load_searcher
from r3rag.retrieval.shards import VectorStore, VectorStoreError
from r3rag.retrieval.testing import TOY_PASSAGES, make_tiny_encoder, write_toy_corpus

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
N = 300
SHARD = 50  # 6 shards


def passages(n: int = N, salt: str = "") -> list[tuple[str, str]]:
    return [(f"Entity {i}{salt}", f"Entity {i} lives near {TOY_PASSAGES[i % 12][0]} and likes "
             f"{TOY_PASSAGES[(i * 7) % 12][0]}; {TOY_PASSAGES[(i * 5) % 12][1]}") for i in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", passages())


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


@pytest.fixture(scope="module")
def enc(encoder_dir) -> Encoder:
    return Encoder(str(encoder_dir), family="sbert", device="cpu", batch_size=16)


@pytest.fixture(scope="module")
def reference(corpus, enc, tmp_path_factory) -> Path:
    """An uninterrupted encode of the corpus (vectors only)."""
    out = tmp_path_factory.mktemp("ref") / "idx"
    build_dense(corpus, out, enc, shard_size=SHARD, chunk_size=16, stage="encode", show_progress=False)
    return out


def all_vectors(index_dir: Path) -> np.ndarray:
    return np.concatenate([b for _, b in VectorStore(index_dir / "vectors").iter_blocks()])


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_tool(*args: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The stderr of a failed command: exactly one 'error:' line and no traceback."""
    assert proc.returncode != 0, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Loading weights" not in ln
             and not ln.startswith("WARNING clustering")]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


KILL_SCRIPT = """
import os, signal, sys, torch
torch.set_num_threads(1)
from pathlib import Path
from r3rag.retrieval.dense_index import build_dense
from r3rag.retrieval.encoders import Encoder
corpus, out, enc_dir, shard = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
enc = Encoder(enc_dir, family="sbert", device="cpu", batch_size=16)
def die(i, rec):
    if i == 1:  # shard 2 was being written when the kill came: a torn temp file and a torn final file, no record
        vec = out / "vectors"
        (vec / f"shard-00002.npy.tmp.{os.getpid()}").write_bytes(b"\\x93NUMPY torn")
        (vec / "shard-00002.npy").write_bytes(b"\\x93NUMPY torn")
        os.kill(os.getpid(), signal.SIGKILL)
build_dense(corpus, out, enc, shard_size=shard, chunk_size=16, stage="encode", show_progress=False, on_shard_done=die)
"""


def test_resume_after_kill_redoes_at_most_one_shard_and_gives_identical_vectors(corpus, enc, encoder_dir, reference, tmp_path):
    out = tmp_path / "idx"
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(corpus), str(out), str(encoder_dir), str(SHARD)],
                          env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    vec = out / "vectors"
    assert sorted(p.name for p in vec.glob("shard-*.json")) == ["shard-00000.json", "shard-00001.json"]
    with pytest.raises(VectorStoreError, match="4 of 6 shards missing"):
        VectorStore(vec)  # an unfinished encode is never taken for a finished one
    encoded: list[int] = []
    build_dense(corpus, out, enc, shard_size=SHARD, chunk_size=16, stage="encode", show_progress=False,
                on_shard_done=lambda i, rec: encoded.append(i))
    assert encoded == [2, 3, 4, 5]  # shards 0-1 kept; 2 (interrupted) is the only one done twice
    assert not list(vec.glob("*.tmp.*"))
    np.testing.assert_array_equal(all_vectors(out), all_vectors(reference))
    assert all_vectors(out).dtype == np.float32 and VectorStore(vec).shards[0].dtype == np.float16


def test_rerun_of_a_finished_encode_encodes_nothing(corpus, enc, reference):
    encoded: list[int] = []
    build_dense(corpus, reference, enc, shard_size=SHARD, chunk_size=16, stage="encode", show_progress=False,
                on_shard_done=lambda i, rec: encoded.append(i))
    assert encoded == []


def test_shard_with_wrong_size_is_not_trusted(corpus, enc, reference, tmp_path):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(reference, out)
    shard = out / "vectors" / "shard-00003.npy"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated after its record was written
    encoded: list[int] = []
    build_dense(corpus, out, enc, shard_size=SHARD, chunk_size=16, stage="encode", show_progress=False,
                on_shard_done=lambda i, rec: encoded.append(i))
    assert encoded == [3]
    np.testing.assert_array_equal(all_vectors(out), all_vectors(reference))


@pytest.mark.slow
def test_two_processes_encode_the_same_vectors_as_one(corpus, enc, reference, tmp_path):
    out = tmp_path / "idx"
    build_dense(corpus, out, enc, shard_size=SHARD, chunk_size=16, stage="encode", show_progress=False,
                devices=["cpu", "cpu"], encoder_kwargs=enc.init_kwargs(device="cpu"), threads=1)
    recs = [json.loads((out / "vectors" / f"shard-{i:05d}.json").read_text()) for i in range(6)]
    assert len({r["device"] for r in recs}) == 1 and all(r["end"] - r["start"] == SHARD for r in recs)
    np.testing.assert_array_equal(all_vectors(out), all_vectors(reference))


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,PQ8x4", "IVF4,PQ16x4fs"])
def test_memory_mapped_index_answers_like_the_in_memory_one(corpus, enc, reference, tmp_path, factory):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(reference, out)
    build_dense(corpus, out, enc, factory=factory, shard_size=SHARD, chunk_size=16, train_size=300,
                stage="index", show_progress=False)
    queries = ["Entity 7 lives near Quorrin", "blue cheese goats", "comet returns", "silver mines"]
    mapped = load_searcher(out, mmap=True, encoder=enc, nprobe=2)
    loaded = load_searcher(out, mmap=False, encoder=enc, nprobe=2)
    assert mapped.loaded_with == "IO_FLAG_MMAP_IFC" and loaded.loaded_with == "read"
    a, b = mapped.search(queries, 5), loaded.search(queries, 5)
    assert [[p.id for p in r] for r in a] == [[p.id for p in r] for r in b]
    assert [[p.score for p in r] for r in a] == [[p.score for p in r] for r in b]


def test_ivfpq_with_exact_rescoring_of_every_candidate_equals_flat(corpus, enc, reference, tmp_path):
    """nprobe = all lists and refine_k = all rows: the re-scored IVF-PQ answer is the exact one,
    with the exact scores, so re-scoring reads the right rows of the right shards."""
    import shutil

    for name, factory in (("flat", "Flat"), ("ivf", "IVF4,PQ8x4")):
        shutil.copytree(reference, tmp_path / name)
        build_dense(corpus, tmp_path / name, enc, factory=factory, shard_size=SHARD,
                    train_size=300, stage="index", show_progress=False)
    m = json.loads((tmp_path / "ivf" / "manifest.json").read_text())["dense"]
    assert m["refine_k"] == 100 and m["vectors_dir"] == "vectors" and m["nprobe"] == 16  # max(16, lists / 8)
    queries = [f"Entity {i} lives near {TOY_PASSAGES[i % 12][0]}" for i in range(0, 300, 7)]
    flat = load_searcher(tmp_path / "flat", encoder=enc).search(queries, 5)
    exact = load_searcher(tmp_path / "ivf", encoder=enc, nprobe=4, refine_k=N).search(queries, 5)
    # the toy passages repeat (tied scores), so compare scores, and count a hit by score
    np.testing.assert_allclose([[p.score for p in r] for r in exact], [[p.score for p in r] for r in flat], atol=1e-6)
    plain = load_searcher(tmp_path / "ivf", encoder=enc, nprobe=4, refine_k=0).search(queries, 5)
    qv = enc.encode(queries, "query")
    vecs = all_vectors(tmp_path / "flat")
    row = {f"doc-{i}": i for i in range(N)}

    def recall(res):
        return np.mean([np.mean([float(vecs[row[p.id]] @ qv[i]) >= flat[i][-1].score - 1e-5 for p in r])
                        for i, r in enumerate(res)])

    assert recall(exact) == 1.0 and recall(plain) < 1.0  # PQ alone loses neighbours at 8 bytes a vector


def test_compressed_layout_from_a_prebuilt_flat_index(corpus, enc, encoder_dir, reference, tmp_path):
    """Search-R1 ships a Flat index: its vectors become the shards of an IVF-PQ index without
    encoding again, and one made by another encoder is refused."""
    import faiss

    flat = faiss.IndexFlatIP(enc.dim)
    flat.add(all_vectors(reference))
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    m = build_dense(corpus, tmp_path / "ivf", enc, factory="IVF4,PQ8x4", shard_size=SHARD, train_size=300,
                    vectors_from=tmp_path / "e5_Flat.index", show_progress=False)
    assert m.dense.encode_dtype == "from:e5_Flat.index" and m.dense.probe
    np.testing.assert_array_equal(all_vectors(tmp_path / "ivf"), all_vectors(reference))
    q = ["Entity 7 lives near Quorrin", "silver mines"]
    got = load_searcher(tmp_path / "ivf", encoder=enc, nprobe=4, refine_k=N).search(q, 3)
    _, rows = flat.search(enc.encode(q, "query"), 3)
    np.testing.assert_allclose([[p.score for p in r] for r in got],
                               [[float(all_vectors(reference)[i] @ v) for i in rr] for rr, v in zip(rows, enc.encode(q, "query"))],
                               atol=1e-5)
    other = Encoder(str(make_tiny_encoder(tmp_path / "other-bert", seed=2)), family="sbert", device="cpu")
    with pytest.raises(IndexError_, match="differ from what"):
        build_dense(corpus, tmp_path / "ivf2", other, factory="IVF4,PQ8x4", shard_size=SHARD, train_size=300,
                    vectors_from=tmp_path / "e5_Flat.index", show_progress=False)
    assert not (tmp_path / "ivf2" / "manifest.json").exists() and not (tmp_path / "ivf2" / "vectors" / "shard-00000.json").exists()


def test_bm25_memory_mapped_answers_like_in_memory(corpus, tmp_path):
    from r3rag.retrieval.bm25_index import build_bm25

    build_bm25(corpus, tmp_path / "bm25", show_progress=False)
    queries = ["Entity 7 Quorrin", "blue cheese goats", "comet seventy-six years"]
    a = load_searcher(tmp_path / "bm25", backend="numpy", bm25_mmap=True)
    b = load_searcher(tmp_path / "bm25", backend="numpy")
    assert isinstance(a.retriever.scores["data"], np.memmap) and not isinstance(b.retriever.scores["data"], np.memmap)
    ra, rb = a.search(queries, 5), b.search(queries, 5)
    assert [[(p.id, p.score) for p in r] for r in ra] == [[(p.id, p.score) for p in r] for r in rb]


# ---------------------------------------------------------------- refusals, one line each
@pytest.fixture(scope="module")
def flat_index(corpus, enc, reference, tmp_path_factory) -> Path:
    import shutil

    out = tmp_path_factory.mktemp("flat") / "idx"
    shutil.copytree(reference, out)
    build_dense(corpus, out, enc, factory="Flat", shard_size=SHARD, stage="index", show_progress=False)
    return out


def test_server_refuses_another_encoder(flat_index, tmp_path):
    other = make_tiny_encoder(tmp_path / "other-bert", seed=1)
    proc = run_tool("tool/retrieval_server.py", "--index", str(flat_index), "--encoder", str(other), "--port", "1")
    line = one_error_line(proc)
    assert "built with" in line and "other-bert" in line and "cosine" in line
    with pytest.raises(R3RagError, match="encodes the probe"):
        load_searcher(flat_index, encoder=str(other))


def test_server_accepts_the_same_encoder_from_another_folder(flat_index, encoder_dir, tmp_path):
    import shutil

    moved = shutil.copytree(encoder_dir, tmp_path / "moved-bert")
    s = load_searcher(flat_index, encoder=str(moved))
    assert s.search(["Entity 3"], 1)[0]


def test_corpus_that_is_not_the_indexed_one_is_refused(flat_index, tmp_path):
    import shutil

    idx = shutil.copytree(flat_index, tmp_path / "idx")
    manifest = json.loads((idx / "manifest.json").read_text())
    other = write_toy_corpus(tmp_path / "other.jsonl", passages(N + 10))
    manifest["corpus"]["path"] = str(other)
    (idx / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexError_, match="rebuild the index"):
        load_searcher(idx)
    proc = run_tool("tool/retrieval_server.py", "--index", str(idx), "--port", "1")
    assert "rebuild the index" in one_error_line(proc)


def test_index_file_of_another_corpus_is_refused(flat_index, corpus, enc, tmp_path):
    import shutil

    small = write_toy_corpus(tmp_path / "small.jsonl", passages(40))
    build_dense(small, tmp_path / "small", enc, shard_size=SHARD, show_progress=False)
    idx = shutil.copytree(flat_index, tmp_path / "idx")
    shutil.copyfile(tmp_path / "small" / "dense.index", idx / "dense.index")
    with pytest.raises(IndexError_, match="index holds 40 vectors, corpus 300"):
        load_searcher(idx, encoder=enc)


def test_vectors_of_another_corpus_are_refused_at_index_stage(reference, enc, tmp_path):
    import shutil

    other = write_toy_corpus(tmp_path / "other.jsonl", passages(N, salt="b"))
    idx = shutil.copytree(reference, tmp_path / "idx")
    (idx / "offsets.npy").unlink()
    with pytest.raises(IndexError_, match="vectors of a corpus of 300 passages"):
        build_dense(other, idx, enc, stage="index", show_progress=False)
    assert not (idx / "manifest.json").exists() and not (idx / "dense.index").exists()


def test_resume_with_another_encoder_is_refused(corpus, reference, tmp_path):
    import shutil

    idx = shutil.copytree(reference, tmp_path / "idx")
    other = Encoder(str(make_tiny_encoder(tmp_path / "wide-bert", hidden=48)), family="sbert", device="cpu")
    with pytest.raises(VectorStoreError, match="cannot be resumed.*--fresh"):
        build_dense(corpus, idx, other, shard_size=SHARD, stage="encode", show_progress=False)


def test_out_of_disk_is_refused_before_anything_is_written(corpus, encoder_dir, tmp_path, monkeypatch):
    import r3rag.retrieval.resources as resources

    monkeypatch.setattr(resources, "free_disk_bytes", lambda path: 10_000)
    enc = Encoder(str(encoder_dir), family="sbert", device="cpu")
    with pytest.raises(resources.ResourceError, match=r"needs .* on .*, 0\.01 MB free|needs .* free"):
        build_dense(corpus, tmp_path / "idx", enc, shard_size=SHARD, show_progress=False)
    assert not (tmp_path / "idx" / "vectors").exists() and not (tmp_path / "idx" / "manifest.json").exists()


def test_out_of_memory_names_the_need_and_the_flag(corpus, encoder_dir, tmp_path):
    proc = run_tool("tool/build_index.py", "--corpus", str(corpus), "--method", "dense", "--out", str(tmp_path / "idx"),
                    "--model", str(encoder_dir), "--model-family", "sbert", "--quiet",
                    extra_env={"R3RAG_MEMORY_BYTES": "1000000"})
    line = one_error_line(proc)
    assert "of RAM, 1 MB available" in line and "--fp16" in line and "IVF" in line
    assert not (tmp_path / "idx" / "manifest.json").exists() and not (tmp_path / "idx" / "vectors").exists()


def test_failed_rebuild_leaves_no_manifest_to_trust(flat_index, corpus, enc, tmp_path, monkeypatch):
    import shutil

    import r3rag.retrieval.resources as resources

    idx = shutil.copytree(flat_index, tmp_path / "idx")
    monkeypatch.setenv("R3RAG_MEMORY_BYTES", "1000")
    with pytest.raises(resources.ResourceError):
        build_dense(corpus, idx, enc, factory="HNSW32", stage="index", show_progress=False)
    with pytest.raises(IndexError_, match="no manifest.json"):
        load_searcher(idx)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_gpu_flags_on_a_cpu_machine_are_one_line(flat_index, corpus, encoder_dir, tmp_path):
    proc = run_tool("tool/retrieval_server.py", "--index", str(flat_index), "--faiss-gpu", "--port", "1")
    assert "--faiss-gpu" in one_error_line(proc)
    proc = run_tool("tool/build_index.py", "--corpus", str(corpus), "--method", "dense", "--out", str(tmp_path / "g"),
                    "--model", str(encoder_dir), "--devices", "all")
    assert "no CUDA GPU" in one_error_line(proc)


@pytest.mark.gpu
def test_gpu_encode_and_faiss_gpu_search_match_cpu(corpus, encoder_dir, flat_index, tmp_path):
    out = tmp_path / "gpu"
    proc = run_tool("tool/build_index.py", "--corpus", str(corpus), "--method", "dense", "--out", str(out),
                    "--model", str(encoder_dir), "--model-family", "sbert", "--devices", "all",
                    "--shard-size", str(SHARD), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "manifest.json").read_text())["dense"]["encode_dtype"] == "float16"
    cos = np.sum(all_vectors(out) * all_vectors(flat_index), axis=1)
    assert cos.min() > 0.99
    import faiss

    if faiss.get_num_gpus() == 0:
        pytest.skip("faiss-gpu is not installed")
    q = ["Entity 7 lives near Quorrin", "blue cheese goats"]
    gpu = load_searcher(flat_index, faiss_gpu=True).search(q, 5)
    cpu = load_searcher(flat_index).search(q, 5)
    assert [[p.id for p in r] for r in gpu] == [[p.id for p in r] for r in cpu]
