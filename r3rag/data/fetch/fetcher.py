"""Plan and carry out a fetch: which files are already good, what to download, whether it fits.

For every selected item (catalog order, so derived files come after what they are made from):

1. its output is checked against the manifest (size and sha256): a good one is kept, a corrupt
   one is named and rebuilt;
2. each repository file it needs is downloaded into ``OUT/.hub/{repo}/{path}`` unless a verified
   copy is there (:func:`r3rag.data.fetch.hub.download`: resumes, checks the published sha256);
3. the output is built atomically (:mod:`r3rag.data.fetch.convert`) and recorded; the raw
   download is deleted afterwards unless ``keep_raw``.

Before anything is downloaded the plan's disk need (bytes still to download plus the outputs,
the unpacked corpus estimated) is compared with the free space under ``OUT``; too little stops
the fetch with one line saying how much is needed.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from r3rag.data.fetch import convert
from r3rag.data.fetch.catalog import DEFAULT_REPOS, Item, Remote
from r3rag.data.fetch.hub import FetchError, RemoteFile, download, partial_bytes, remote_file
from r3rag.data.fetch.manifest import Manifest

RAW_DIR = ".hub"
LOCK = ".fetch.lock"


@dataclass
class Settings:
    out: Path = Path("data")
    repos: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_REPOS))
    revision: str = "main"
    endpoint: str | None = None
    keep_raw: bool = False
    seed: int = 0
    progress: bool = True


@dataclass
class Step:
    """One item of the plan: ``status`` is ``ok`` or why it must be (re)built."""

    item: Item
    status: str
    remotes: list[RemoteFile] = field(default_factory=list)
    have: int = 0  # bytes of those remotes already on disk (verified copies and part files)

    @property
    def download_bytes(self) -> int:
        return max(sum(r.size or 0 for r in self.remotes) - self.have, 0)

    @property
    def output_bytes(self) -> int:
        return int(sum(r.size or 0 for r in self.remotes) * self.item.expand)


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


class Fetcher:
    def __init__(self, settings: Settings, items: list[Item], log=None) -> None:
        self.s = settings
        self.items = items
        self.manifest = Manifest(settings.out)
        self.log = log or (lambda msg: print(msg, flush=True))

    def output(self, item: Item) -> Path:
        return self.s.out / item.output

    def raw(self, remote: Remote) -> Path:
        return self.s.out / RAW_DIR / self.s.repos[remote.role] / remote.path

    def remote(self, r: Remote) -> RemoteFile:
        return remote_file(self.s.repos[r.role], r.path, self.s.revision, self.s.endpoint)

    # ---- planning --------------------------------------------------------------------------
    def plan(self, deep: bool = True) -> list[Step]:
        """Each item's status; items to build carry their remote files' metadata (one HEAD each).
        ``deep=False`` checks sizes only (``--dry-run``: no hashing of big files)."""
        steps = []
        for item in self.items:
            status = self._check(self.output(item), deep)
            step = Step(item, status or "ok")
            if status is not None:
                for r in item.remotes:
                    rf = self.remote(r)
                    step.remotes.append(rf)
                    raw = self.raw(r)
                    entry = self.manifest.entry(raw)
                    if raw.is_file() and entry and entry.get("etag") == rf.etag and self._check(raw, False) is None:
                        step.have += rf.size or 0
                    else:
                        step.have += partial_bytes(raw, rf)
            steps.append(step)
        return steps

    def _check(self, path: Path, deep: bool) -> str | None:
        if not deep:
            entry = self.manifest.entry(path)
            if not path.is_file():
                return "missing"
            if entry is None or entry["size"] != path.stat().st_size:
                return "not in the manifest or wrong size"
            return None
        return self.manifest.check(path, progress=self.s.progress)

    def disk_need(self, steps: list[Step]) -> tuple[int, int, int]:
        """(bytes needed at the peak, to download, outputs): every output, plus every download
        when raw files are kept, else the largest item's download (its raw files go once built)."""
        todo = [s for s in steps if s.status != "ok"]
        down = [s.download_bytes for s in todo]
        outs = sum(s.output_bytes for s in todo)
        dl = sum(down) if self.s.keep_raw else max(down, default=0)
        return outs + dl, sum(down), outs

    def check_space(self, steps: list[Step]) -> None:
        need, down, outs = self.disk_need(steps)
        free = free_bytes(self.s.out)
        if need > free:
            raise FetchError(f"{self.s.out}: needs {gb(need)} free (download {gb(down)}, outputs ~{gb(outs)}), "
                             f"has {gb(free)}; free space, use --out on a larger disk, or fetch fewer items")

    # ---- doing -----------------------------------------------------------------------------
    def run(self, steps: list[Step]) -> int:
        """Build every step that is not ok; returns how many were built."""
        self.check_space(steps)
        built = 0
        for step in steps:
            out = self.output(step.item)
            if step.status == "ok":
                self.log(f"ok      {out} (verified)")
                continue
            if out.is_file():  # corrupt, or not the file the manifest recorded
                self.log(f"{out}: {step.status}; rebuilding it")
                out.unlink(missing_ok=True)
                self.manifest.forget(out)
            self._build(step)
            built += 1
        return built

    def _fetch_raw(self, rf: RemoteFile, r: Remote) -> Path:
        raw = self.raw(r)
        entry = self.manifest.entry(raw)
        if raw.is_file() and entry is not None and entry.get("etag") == rf.etag:
            problem = self.manifest.check(raw, progress=self.s.progress)
            if problem is None:
                return raw
            self.log(f"{raw}: {problem}; downloading it again")
        elif raw.is_file():
            self.log(f"{raw}: not recorded as a finished download of {rf.source}; downloading it again")
        raw.unlink(missing_ok=True)
        self.manifest.forget(raw)
        digest = download(rf, raw, progress=self.s.progress)
        self.manifest.record(raw, digest, etag=rf.etag, **{"from": rf.source})
        return raw

    def _build(self, step: Step) -> None:
        item, out = step.item, self.output(step.item)
        raws = [self._fetch_raw(rf, r) for rf, r in zip(step.remotes, item.remotes)]
        sources = [rf.source for rf in step.remotes]
        info: dict = {}
        if item.build == "questions":
            digest, rows = convert.convert_questions(raws[0], out, item.options["dataset"])
            info["rows"] = rows
        elif item.build == "gunzip":
            digest, rows = convert.gunzip(raws[0], out, self.s.progress)
            info["rows"] = rows
        elif item.build == "concat":
            digest, _ = convert.concat(raws, out, self.s.progress)
        elif item.build in ("sample", "mix"):
            deps = {name: self.s.out / next(i.output for i in self.items if i.name == name) for name in item.needs}
            sources = [self.manifest.rel(p) for p in deps.values()]
            if item.build == "sample":
                digest, rows = convert.sample(next(iter(deps.values())), out, item.options["n"], self.s.seed)
            else:
                digest, rows = convert.mix({n.rsplit("_", 1)[0]: p for n, p in deps.items()}, out, self.s.seed)
            info.update(rows=rows, seed=self.s.seed)
        else:  # pragma: no cover - the catalog only names the builds above
            raise FetchError(f"{item.name}: unknown build {item.build!r}")
        self.manifest.record(out, digest, **info, **{"from": sources})
        self.log(f"fetched {out}" + (f" ({info['rows']:,} rows)" if "rows" in info else f" ({gb(out.stat().st_size)})"))
        if not self.s.keep_raw:
            for raw in raws:
                raw.unlink(missing_ok=True)
                self.manifest.forget(raw)

    def verify(self) -> list[str]:
        """Every manifest file that is missing or corrupt, as ``path: problem`` lines."""
        bad = []
        for rel in sorted(self.manifest.files):
            path = self.s.out / rel
            problem = self.manifest.check(path, progress=self.s.progress)
            if problem is not None:
                bad.append(f"{path}: {problem}")
        return bad


def eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
