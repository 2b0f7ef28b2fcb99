"""``r3rag.machine.cpu_name``: the CPU named beside every benchmark figure."""

from r3rag.machine import cpu_name


def test_cpu_name_reads_the_model_and_marks_native_bf16(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_name(info) == "Example CPU 9000 (avx512_bf16)"
    info.write_text("processor\t: 0\nmodel name\t: Older CPU\nflags\t\t: fpu avx2\n")
    assert cpu_name(info) == "Older CPU"
    assert cpu_name(tmp_path / "missing") == "unknown"


def test_native_bf16_reads_the_flags(tmp_path):
    from r3rag.machine import native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: A\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert native_bf16(info) is True
    info.write_text("model name\t: S\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n")
    assert native_bf16(info) is True
    info.write_text("model name\t: B\nflags\t\t: fpu avx2 avx512f\n")  # AVX-512 without bf16 arithmetic
    assert native_bf16(info) is False
    assert native_bf16(tmp_path / "missing") is False


def test_the_quickstart_names_the_cpu_and_warns_where_it_runs_in_float32(tmp_path):
    from r3rag.quickstart import machine_note

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Fast CPU\nflags\t\t: avx2 avx512f avx512_bf16\n")
    assert machine_note(60, info).startswith("machine: Fast CPU (avx512_bf16), ")
    assert "float32" not in machine_note(60, info)
    info.write_text("model name\t: Old CPU\nflags\t\t: avx2\n")
    note = machine_note(60, info)
    assert note.startswith("machine: Old CPU, ") and "every stage runs in float32" in note and "60-minute budget" in note
    assert "budget" not in machine_note(None, info)


def test_stage_markers_record_the_cpu_and_the_report_names_it(tmp_path):
    from r3rag.machine import cpu_name
    from r3rag.pipeline.report import _time_lines
    from r3rag.pipeline.state import PipelineState

    state = PipelineState(tmp_path)
    state.mark_done("sft", "fp", {}, 90.0)
    assert state.get("sft")["cpu"].startswith(cpu_name())

    same = _time_lines([("sft", 90.0, 1, "X (avx512_bf16), 2 cores"), ("rl", 600.0, 2, "X (avx512_bf16), 2 cores")], 60)
    assert "CPU: X (avx512_bf16), 2 cores." in same and "| stage | time |" in same
    assert "| rl | 10.0 min (2 runs: resumed) |" in same and "| total | 11.5 min (budget 60 min: within) |" in same
    assert not any("float32" in line for line in same)

    mixed = _time_lines([("sft", 90.0, 1, "X (avx512_bf16), 2 cores"), ("rl", 3700.0, 1, "Y, 2 cores")], 60)
    assert "| stage | time | CPU |" in mixed and "| rl | 61.7 min | Y, 2 cores |" in mixed
    assert "| total | 63.2 min (budget 60 min: OVER) | |" in mixed
    assert any(line.startswith("Y, 2 cores: no native bf16") and "ran in float32" in line for line in mixed)
