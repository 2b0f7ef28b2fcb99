"""``r3rag.machine.cpu_name``: the CPU named beside every benchmark figure."""

from r3rag.machine import cpu_name


def test_cpu_name_reads_the_model_and_marks_native_bf16(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_name(info) == "Example CPU 9000 (avx512_bf16)"
    info.write_text("processor\t: 0\nmodel name\t: Older CPU\nflags\t\t: fpu avx2\n")
    assert cpu_name(info) == "Older CPU"
    assert cpu_name(tmp_path / "missing") == "unknown"
