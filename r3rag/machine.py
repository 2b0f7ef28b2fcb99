"""What machine a figure was measured on, and what its CPU can do in bf16.

Every benchmark and the quickstart's report name the CPU beside their numbers. Whether bfloat16
pays on a CPU is read from its flags (``/proc/cpuinfo``, through :func:`read_cpuinfo`, the one
place that reads it): ``avx512_bf16`` (AVX-512 BF16 dot products) or ``amx_bf16`` (AMX tiles) mean
native bf16 arithmetic. :mod:`r3rag.precision` turns these facts into the precision of every
stage.

>>> isinstance(cpu_name(), str) and cpu_name() != ""
True
>>> isinstance(native_bf16(), bool)
True
>>> cpu_class(frozenset({"avx2", "avx512f"})), cpu_class(frozenset({"avx2", "avx512f", "avx512_bf16"}))
('avx512', 'avx512_bf16')
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = "/proc/cpuinfo"
#: CPU flags of native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
#: what :func:`cpu_name` appends for such a CPU (the report reads it back from stage markers)
BF16_MARK = " (avx512_bf16)"


def read_cpuinfo(cpuinfo: str | Path = CPUINFO) -> str:
    """The text of ``/proc/cpuinfo`` (or of ``cpuinfo``); empty where it cannot be read."""
    try:
        return Path(cpuinfo).read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | Path = CPUINFO) -> frozenset[str]:
    """The CPU's flags (every word of the file: flag names do not collide with other fields)."""
    return frozenset(read_cpuinfo(cpuinfo).split())


def native_bf16(cpuinfo: str | Path = CPUINFO) -> bool:
    """Whether the CPU's flags include native bf16 arithmetic (``False`` where they cannot be read)."""
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def cpu_class(flags: frozenset[str]) -> str:
    """``amx`` (amx_bf16), ``avx512_bf16``, ``avx512`` (AVX-512 without bf16 arithmetic),
    ``avx2``, or ``other``: the classes whose bf16-versus-fp32 speed differs (docs/results/precision.md)."""
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "other"


def cpu_name(cpuinfo: str | Path = CPUINFO) -> str:
    """The CPU's model name, with :data:`BF16_MARK` when it has native bf16 arithmetic (which decides
    whether bf16 pays on it); ``unknown`` where the file cannot be read."""
    text = read_cpuinfo(cpuinfo)
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
