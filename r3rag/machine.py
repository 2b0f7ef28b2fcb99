"""What machine a figure was measured on, and whether bf16 pays on it.

Every benchmark and the quickstart's report name the CPU beside their numbers; the ``auto`` dtypes
of evaluation and RL pick bfloat16 only where :func:`native_bf16` says the CPU has bf16 arithmetic
(on AVX2-only CPUs bf16 measured 7-13x slower than float32, docs/rl.md).

>>> isinstance(cpu_name(), str) and cpu_name() != ""
True
>>> isinstance(native_bf16(), bool)
True
"""

from __future__ import annotations

from pathlib import Path


#: CPU flags of native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
#: what :func:`cpu_name` appends for such a CPU (the report reads it back from stage markers)
BF16_MARK = " (avx512_bf16)"


def native_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether the CPU's flags include native bf16 arithmetic (``False`` where they cannot be read)."""
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:
        return False
    return bool(flags & NATIVE_BF16_FLAGS)


def cpu_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name, with :data:`BF16_MARK` when it has native bf16 arithmetic (which decides
    whether bf16 pays on it); ``unknown`` where the file cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "unknown")
    return name + (BF16_MARK if set(text.split()) & NATIVE_BF16_FLAGS else "")


def resolve_device(spec: str, key: str = "model.device", note=None) -> str:
    """The torch device ``spec`` names, checked against this machine before any model is loaded.

    ``auto`` is ``cuda`` when torch sees a CUDA GPU, else ``cpu`` (with a one-line note through
    ``note``, stderr by default); ``cuda``/``cuda:N`` on a machine without one (a CPU build of
    torch, no driver, fewer GPUs) is a :class:`~r3rag.errors.ConfigError` naming ``key``, never a
    traceback from deep inside ``model.to``. Other devices (``cpu``, ``mps``) pass through.

    >>> resolve_device("cpu")
    'cpu'
    """
    from r3rag.errors import ConfigError

    spec = spec.strip().lower()
    if spec not in ("auto",) and not spec.startswith("cuda"):
        return spec
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "auto":
        if count:
            return "cuda"
        why = "torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA GPU"
        (note or _stderr)(f"note: {key}=auto -> cpu ({why})")
        return "cpu"
    index = spec.partition(":")[2]
    if not count:
        why = (f"torch {torch.__version__} is a CPU build (make gpu-env installs CUDA torch)"
               if torch.version.cuda is None else "torch sees no CUDA GPU (driver, CUDA_VISIBLE_DEVICES?)")
        raise ConfigError(f"{key}={spec} but {why}; use {key}=auto or cpu")
    if index and (not index.isdigit() or int(index) >= count):
        raise ConfigError(f"{key}={spec}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    return spec


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)
