"""What this machine can give a build: free disk, available memory, visible GPUs.

The index builder checks these *before* it writes anything, so that a build which cannot
finish says so in one line (how much it needs, how much there is, which flag lowers it) instead
of dying hours later with a half-written directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from r3rag.errors import R3RagError

GB = 1e9


class ResourceError(R3RagError):
    """Not enough disk or memory for the requested build."""


def gb(n_bytes: float) -> str:
    return f"{n_bytes / GB:.1f} GB" if n_bytes >= 0.1 * GB else f"{n_bytes / 1e6:.0f} MB"


def free_disk_bytes(path: str | Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def _cgroup_limit() -> int | None:
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(f).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:
            return int(raw)
    return None


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, capped by a cgroup memory limit; None where unknown."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = _cgroup_limit()
    if limit is not None:
        try:
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        except (OSError, ValueError):
            used = 0
        avail = min(avail, limit - used) if avail is not None else limit - used
    return avail


def check_disk(path: str | Path, needed: int, what: str, lower_with: str) -> None:
    free = free_disk_bytes(path)
    if needed > free:
        raise ResourceError(f"{what} needs {gb(needed)} on {path}, {gb(free)} free; {lower_with}")


def check_memory(needed: int, what: str, lower_with: str) -> None:
    """Raise unless ``needed`` bytes fit in available memory (R3RAG_MEMORY_BYTES overrides the probe)."""
    forced = os.environ.get("R3RAG_MEMORY_BYTES")
    avail = int(forced) if forced else available_memory_bytes()
    if avail is not None and needed > avail:
        raise ResourceError(f"{what} needs {gb(needed)} of RAM, {gb(avail)} available; {lower_with}")


def current_rss_bytes() -> int:
    """Resident set size of this process now (0 where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
