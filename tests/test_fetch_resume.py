"""A fetch killed mid-download continues where it stopped: the next run asks the hub for the
remaining bytes only (``Range: bytes=N-``) and the joined file is exactly the published one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from r3rag.data.fetch.catalog import DEFAULT_REPOS
from r3rag.data.fetch.cli import main
from r3rag.testing.hub_standin import HubStandin

ROOT = Path(__file__).resolve().parents[1]
INDEX = f"datasets/{DEFAULT_REPOS['index']}"
# huggingface_hub writes in 10 MB blocks; a small block makes a 400 kB file behave like a big one
CHILD = ("import huggingface_hub.constants as c; c.DOWNLOAD_CHUNK_SIZE = 8192; "
         "from r3rag.cli import run_main; from r3rag.data.fetch.cli import main; run_main(main)")


@pytest.fixture(autouse=True)
def online(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def test_killed_download_resumes_from_its_part_file(tmp_path):
    blob = os.urandom(400_000)
    with HubStandin({INDEX: {"part_aa": blob[:300_000], "part_ab": blob[300_000:]}},
                    chunk_bytes=8192, delay_s=0.05) as hub:
        out = tmp_path / "data"
        proc = subprocess.Popen([sys.executable, "-c", CHILD, "e5-index", "--out", str(out), "--quiet"], cwd=ROOT,
                                env={**os.environ, "HF_ENDPOINT": hub.url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        raw = out / ".hub" / DEFAULT_REPOS["index"]
        deadline = time.monotonic() + 60
        parts: list[Path] = []
        while time.monotonic() < deadline:
            parts = [p for p in raw.glob("part_aa.*.part") if p.stat().st_size >= 50_000]
            if parts or proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert parts, f"no partial download seen: {proc.stderr.read().decode()[-2000:]}"
        have = parts[0].stat().st_size
        assert 0 < have < 300_000
        assert not (out / "wiki18" / "e5_Flat.index").exists()

        hub.delay_s = 0.0
        n = len(hub.requests)
        assert main(["e5-index", "--out", str(out), "--quiet"] + ["--endpoint", hub.url]) == 0
        resumed = [r for r in hub.requests[n:] if r["method"] == "GET" and r["path"].endswith("part_aa")]
        assert [r["range"] for r in resumed] == [f"bytes={have}-"]
        assert (out / "wiki18" / "e5_Flat.index").read_bytes() == blob
        assert list(raw.glob("*.part")) == []


def test_a_part_file_of_an_older_upload_is_not_joined_to_the_new_one(tmp_path):
    new = os.urandom(50_000)
    with HubStandin({INDEX: {"part_aa": new[:30_000], "part_ab": new[30_000:]}}) as hub:
        raw = tmp_path / ".hub" / DEFAULT_REPOS["index"]
        raw.mkdir(parents=True)
        (raw / "part_aa.0123456789abcdef.part").write_bytes(b"old upload" * 100)
        assert main(["e5-index", "--out", str(tmp_path), "--quiet", "--endpoint", hub.url]) == 0
        assert (tmp_path / "wiki18" / "e5_Flat.index").read_bytes() == new
        gets = [r for r in hub.requests if r["method"] == "GET"]
        assert all(r["range"] is None for r in gets)
