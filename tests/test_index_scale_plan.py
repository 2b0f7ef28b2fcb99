"""tool/build_index.py --plan: sizes are the layouts' arithmetic, times follow the stated model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.errors import R3RagError
from r3rag.retrieval.plan import build_requirements, constants, parse_factory, plan

ROOT = Path(__file__).resolve().parents[1]
WIKI18 = 21_015_324


def test_wiki18_flat_sizes_are_the_arithmetic():
    p = plan(WIKI18, 768, "Flat")
    assert p["disk"]["index"] == WIKI18 * 768 * 4  # 64.6 GB, Search-R1's e5_Flat.index
    assert p["disk"]["vectors_fp16"] == WIKI18 * 768 * 2
    assert p["disk"]["offsets"] == 8 * (WIKI18 + 1)
    assert p["ram"]["serve"] > 64e9 and p["ram"]["index_build"] > 64e9


def test_wiki18_ivfpq_serves_under_8_gb_and_counts_its_parts():
    p = plan(WIKI18, 768, "IVF16384,PQ96")
    assert p["disk"]["index"] == WIKI18 * (96 + 8) + 16384 * 768 * 4 + 256 * 768 * 4
    assert p["ram"]["serve"] < 8e9 and p["refine_k"] == 100
    assert p["ram"]["refine_reads_per_query"] == 100 * 768 * 2
    assert p["train_size"] == 39 * 16384


def test_wiki18_goal_layout_fast_scan():
    """The layout docs/results/index_scale.md proposes for wiki18 on a CPU in 8 GB."""
    p = plan(WIKI18, 768, "IVF16384,PQ192x4fs")
    assert parse_factory("IVF16384,PQ192x4fs", 768).fastscan
    assert p["disk"]["index"] == WIKI18 * (96 + 8) + 16384 * 768 * 4 + 16 * 768 * 4
    assert p["nprobe"] == 2048 and p["refine_k"] == 100 and p["ram"]["serve"] < 8e9
    assert p["gpu_memory"]["search_all_gpus_fp16"] is None  # faiss-gpu has no 4-bit fast-scan IVF


def test_more_gpus_encode_proportionally_faster_and_shard_the_gpu_index():
    one, eight = plan(WIKI18, 768, "Flat", gpus=1), plan(WIKI18, 768, "Flat", gpus=8)
    assert one["time_s"]["encode"] == pytest.approx(8 * eight["time_s"]["encode"])
    assert eight["gpu_memory"]["search_per_gpu_fp16"] == pytest.approx(WIKI18 * 768 * 2 / 8)
    assert "assumed" in eight["encode_rate_how"]


def test_measured_constants_name_their_source():
    for name, c in constants().items():
        assert c["value"] > 0 and c["source"], name


def test_factory_parsing():
    assert parse_factory("HNSW32", 768).storage_bytes == 3072 and parse_factory("HNSW32", 768).hnsw_m == 32
    assert parse_factory("HNSW32,SQfp16", 768).storage_bytes == 1536
    assert parse_factory("IVF4096,PQ64x4", 384).storage_bytes == 32
    with pytest.raises(R3RagError, match="--plan knows"):
        parse_factory("LSH", 768)


def test_build_requirements_point_to_the_flag_that_lowers_them():
    flat = build_requirements(WIKI18, 768, "Flat")
    assert "IVF" in flat["lower_ram_with"] and "--fp16" in flat["lower_ram_with"]
    assert "--train-size" in build_requirements(WIKI18, 768, "IVF16384,PQ96")["lower_ram_with"]


def test_plan_cli_prints_the_table_and_json():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "tool/build_index.py", "--plan", "--passages", str(WIKI18), "--dim", "768",
                          "--factory", "Flat", "--gpus", "8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "projected" in out.stdout and "index 64.6 GB" in out.stdout and "4.0 GB per GPU (32.3 GB in all" in out.stdout
    js = subprocess.run([sys.executable, "tool/build_index.py", "--plan", "--passages", "1000000", "--dim", "384",
                         "--factory", "IVF4096,PQ48", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(js.stdout)["disk"]["index"] == 1_000_000 * 56 + 4096 * 384 * 4 + 256 * 384 * 4
