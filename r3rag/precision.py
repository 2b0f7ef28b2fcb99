"""The one rule that picks the numeric precision of every stage: bf16, fp16 or fp32.

SFT (the LLaMA-Factory YAML's ``bf16``/``fp16`` keys, and the plain-PyTorch GPU path of
``benchmark/gpu_training.py``), RL (the trainer's autocast dtype, and through it the rollout's
copy of the weights and a vLLM engine's dtype), evaluation (``model.dtype: auto``), cold start's
teacher and the demo all call :func:`choose_precision` with what was asked (``auto`` unless a
config says ``fp32``/``bf16``/``fp16``, or their torch names) and the device. It decides from
measured facts about the machine, never from a guess:

================================================  =========  ========================================
machine                                           ``auto``   why
================================================  =========  ========================================
CPU with ``amx_bf16`` (AMX tiles)                 bf16       native bf16 matrix tiles
CPU with ``avx512_bf16``                          bf16       bf16 2.1-2.8x faster than fp32
CPU with AVX-512, no ``avx512_bf16``              fp32       bf16 emulated: a matmul ~6x slower
CPU with AVX2 only (or less)                      fp32       bf16 emulated: 7-13x slower
CUDA GPU with native bf16 (compute cap. >= 8.0)   bf16       tensor cores, fp32 range
CUDA GPU without it (V100, T4, ...)               fp32       fp16 only on request (below)
================================================  =========  ========================================

The CPU classes come from the flags in ``/proc/cpuinfo`` (:func:`r3rag.machine.cpu_flags`), not
from ``torch.backends.cpu.get_cpu_capability()``, which says ``AVX512`` for CPUs with and without
bf16 arithmetic alike. A GPU's bf16 is ``torch.cuda.is_bf16_supported(including_emulation=False)``:
with emulation counted, a V100 says yes and runs bf16 slowly. fp16 is never chosen by ``auto``:
models trained in bf16 (Qwen2.5, Llama 3.1) can overflow its range, and the RL trainer has no loss
scaler; asked for explicitly it is honoured where it exists (CUDA) and refused on a CPU. bf16
asked for on a CPU without native bf16 is honoured with a warning in the reason (it runs, slowly);
on a GPU without native bf16 it is refused.

Each stage prints :meth:`Precision.line` and writes :meth:`Precision.write` (``precision.json``)
into its run folder, so a figure can always be traced to the precision it was made in.

>>> p = choose_precision("fp32", "cpu")
>>> p.name, p.torch_name, p.requested
('fp32', 'float32', 'fp32')
>>> choose_precision("bfloat16", "cpu").name
'bf16'
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from r3rag.errors import ConfigError
from r3rag.machine import CPUINFO, cpu_class, cpu_flags, cpu_name

#: accepted spellings of a request, by the precision they mean
ALIASES = {"auto": "auto", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "fp32": "fp32", "float32": "fp32", "float": "fp32"}
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: the file each run folder gets
RECORD = "precision.json"

#: why ``auto`` picks what it picks on each CPU class (ratios: docs/results/precision.md)
CPU_REASONS = {
    "amx": ("bf16", "the CPU has amx_bf16 (AMX tiles): native bf16 matrix arithmetic"),
    "avx512_bf16": ("bf16", "the CPU has avx512_bf16: bf16 measured 2.1-2.8x faster than fp32 (a matmul, an RL step)"),
    "avx512": ("fp32", "AVX-512 without avx512_bf16 / amx_bf16: bf16 is emulated there, a matmul about 6x slower than fp32"),
    "avx2": ("fp32", "AVX2 without avx512_bf16 / amx_bf16: bf16 is emulated there, 7-13x slower than fp32"),
    "other": ("fp32", "no native bf16 in the CPU flags (avx512_bf16 / amx_bf16)"),
}


@dataclass(frozen=True)
class Precision:
    """A decision: ``name`` (bf16 | fp16 | fp32), what was asked, for which device, on what machine, and why."""

    name: str
    requested: str
    device: str
    machine: str
    reason: str

    @property
    def torch_name(self) -> str:
        """``bfloat16`` | ``float16`` | ``float32`` (transformers' ``dtype=``, vLLM's ``dtype``)."""
        return TORCH_NAMES[self.name]

    @property
    def dtype(self) -> Any:
        import torch

        return getattr(torch, self.torch_name)

    def line(self, stage: str = "") -> str:
        """One line for the log: ``precision (sft): bf16 (asked auto) on cpu, AMD EPYC (avx512_bf16): why``."""
        where = f" ({stage})" if stage else ""
        return f"precision{where}: {self.name} (asked {self.requested}) on {self.device}, {self.machine}: {self.reason}"

    def record(self, stage: str, **more: Any) -> dict[str, Any]:
        fields = asdict(self)
        return {"stage": stage, "precision": fields.pop("name"), "torch_dtype": self.torch_name, **fields, **more}

    def write(self, folder: str | Path, stage: str, echo: bool = True, **more: Any) -> Path:
        """Write ``folder/precision.json`` (``more``: stage-specific choices that follow from it) and
        print :meth:`line` to stderr."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        path = out / RECORD
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record(stage, **more), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        if echo:
            print(self.line(stage), file=sys.stderr, flush=True)
        return path


def normalize(requested: str) -> str:
    """``bf16`` | ``fp16`` | ``fp32`` | ``auto`` for any accepted spelling; a ConfigError otherwise."""
    key = str(requested).strip().lower()
    if key not in ALIASES:
        raise ConfigError(f"precision {requested!r}: use auto, fp32, bf16 or fp16 (or bfloat16 / float32 / float16)")
    return ALIASES[key]


def cuda_facts(device: str) -> tuple[str, bool]:
    """The GPU's name with its compute capability, and whether it has native bf16 arithmetic."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: torch sees no CUDA device (a CPU-only torch, or no GPU visible)")
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    major, minor = torch.cuda.get_device_capability(index)
    name = f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor})"
    try:
        with torch.cuda.device(index):
            bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no emulation argument and counts only native support
        bf16 = bool(torch.cuda.is_bf16_supported())
    return name, bf16


def default_device() -> str:
    """``cuda`` where torch sees a GPU, else ``cpu`` (what a trainer without a device setting uses)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def choose_precision(requested: str = "auto", device: str = "cpu", *, cpuinfo: str | Path = CPUINFO) -> Precision:
    """The precision for a model on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``), given the
    request (``auto`` or an explicit override). The rule and its measured reasons: the module's table."""
    asked = normalize(requested)
    device = default_device() if device in ("auto", "") else str(device)
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        machine, bf16 = cuda_facts(device)
        if asked == "auto":
            if bf16:
                return Precision("bf16", "auto", device, machine, "the GPU has native bf16 (compute capability >= 8.0)")
            return Precision("fp32", "auto", device, machine, "the GPU has no native bf16 (compute capability < 8.0); fp16 "
                             "only on request (models trained in bf16 can overflow it; the RL trainer has no loss scaler)")
        if asked == "bf16" and not bf16:
            raise ConfigError(f"precision bf16 asked for on {machine}, which has no native bf16: use fp32 (or fp16 for SFT)")
        return Precision(asked, asked, device, machine, "asked for explicitly")
    flags = cpu_flags(cpuinfo)
    cls = cpu_class(flags) if kind == "cpu" else "other"
    machine = f"{cpu_name(cpuinfo)}, {os.cpu_count()} cores" if kind == "cpu" else device
    auto_name, why = CPU_REASONS[cls] if kind == "cpu" else ("fp32", f"device {kind}: fp32 unless asked otherwise")
    if asked == "auto":
        return Precision(auto_name, "auto", device, machine, why)
    if asked == "fp16" and kind == "cpu":
        raise ConfigError("precision fp16 needs a CUDA device; on a CPU use fp32 or bf16")
    if asked == "bf16" and auto_name != "bf16" and kind == "cpu":
        return Precision("bf16", "bf16", device, machine, f"asked for explicitly, although {why}")
    return Precision(asked, asked, device, machine, "asked for explicitly")
