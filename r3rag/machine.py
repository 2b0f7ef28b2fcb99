"""What machine a figure was measured on: every benchmark names the CPU beside its numbers.

>>> isinstance(cpu_name(), str) and cpu_name() != ""
True
"""

from __future__ import annotations

from pathlib import Path


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name, with ``(avx512_bf16)`` when it has native bf16 arithmetic (which decides
    whether bf16 pays on it); ``unknown`` where the file cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "unknown")
    return name + (" (avx512_bf16)" if "avx512_bf16" in text else "")
