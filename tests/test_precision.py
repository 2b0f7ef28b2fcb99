"""One precision rule (:mod:`r3rag.precision`) for every stage, on every class of machine.

The CPU flags are faked through :func:`r3rag.machine.read_cpuinfo` (the one reader of
``/proc/cpuinfo``) and the GPU through :func:`r3rag.precision.cuda_facts`; for each class the test
asserts the choice itself and what every stage does with it: the LLaMA-Factory YAML that
``train/sft.py`` writes (with ``precision.json`` beside it), the RL trainer's autocast dtype and
rollout copy, the evaluation's model dtype (HF and vLLM), the quickstart's evaluation dtype and
start-up line, the demo's model dtype, and the plain-PyTorch SFT of ``benchmark/gpu_training.py``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from r3rag import machine
from r3rag import precision as prec
from r3rag.config import load_config
from r3rag.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SFT_CPU = ROOT / "configs" / "sft" / "world-smollm2-cpu.yaml"  # the quickstart's SFT config, as shipped

#: class -> (the CPU's flags, what ``auto`` must pick)
CPUS = {
    "avx2": ("fpu sse4_2 avx avx2 fma", "fp32"),
    "avx512": ("fpu avx2 avx512f avx512bw avx512vl avx512_vnni", "fp32"),  # the Xeon that trained in slow bf16
    "avx512_bf16": ("fpu avx2 avx512f avx512bw avx512_bf16", "bf16"),
    "amx": ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "bf16"),
}
GPUS = {"cuda_bf16": ("NVIDIA H100 (compute capability 9.0)", True, "bf16"),
        "cuda_no_bf16": ("Tesla V100 (compute capability 7.0)", False, "fp32")}


def fake_cpu(monkeypatch, flags: str) -> None:
    text = f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n"
    monkeypatch.setattr(machine, "read_cpuinfo", lambda cpuinfo=machine.CPUINFO: text)


def fake_gpu(monkeypatch, name: str, bf16: bool) -> None:
    monkeypatch.setattr(prec, "cuda_facts", lambda device: (name, bf16))
    monkeypatch.setattr(prec, "default_device", lambda: "cuda")
    # the evaluation resolves its device against torch first: this CPU torch "sees" the fake GPU
    monkeypatch.setattr(machine, "resolve_device", lambda spec, key="model.device", note=None: "cuda" if spec in ("auto", "cuda") else spec)


def no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(prec, "default_device", lambda: "cpu")


def lf_yaml(tmp_path: Path, monkeypatch, *overrides: str) -> tuple[dict, dict]:
    """train/sft.py's own preparation of the shipped CPU config: (the LF YAML, precision.json)."""
    from r3rag.train.sft import base_model
    from r3rag.train.sft.config import SFTConfig
    from r3rag.train.sft.export import dataset_info
    from r3rag.train.sft.launch import prepare

    data = tmp_path / "data"
    (data / "sharegpt").mkdir(parents=True, exist_ok=True)
    (data / "sharegpt" / "part-00000-of-00001.jsonl").write_text("{}\n")
    (data / "dataset_info.json").write_text(json.dumps(dataset_info("r3rag_steps")))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setattr(base_model, "ensure_hf_folder", lambda model, **kw: tmp_path / "model")
    from r3rag.train.sft import lengths
    from r3rag.train.sft.lengths import LengthReport

    # the example-length check needs a real tokenizer; this test is about the precision keys only
    monkeypatch.setattr(lengths, "check_lengths", lambda cfg, model, out: LengthReport(
        examples=1, longest=1, cutoff_len=cfg.data.cutoff_len, longer=0, dataset_dir=str(cfg.data.dataset_dir)))
    cfg = load_config(SFTConfig, SFT_CPU, [f"data.dataset_dir={data}", f"output_dir={tmp_path / 'sft'}",
                                           f"launch.venv={venv}", *overrides])
    _, _, out = prepare(cfg)
    return yaml.safe_load((out / "r3rag_sft.yaml").read_text()), json.loads((out / prec.RECORD).read_text())


@pytest.mark.parametrize("cls", list(CPUS))
def test_each_cpu_class_gets_its_precision_in_every_stage(cls, tmp_path, monkeypatch, capsys):
    from r3rag.evaluation.components import model_precision
    from r3rag.evaluation.config import ModelConfig
    from r3rag.pipeline.stages import eval_dtype
    from r3rag.quickstart import machine_note
    from r3rag.train.rl.loop import resolve_compute_dtype, resolve_rollout_weights

    flags, want = CPUS[cls]
    fake_cpu(monkeypatch, flags)
    no_gpu(monkeypatch)
    assert machine.cpu_class(machine.cpu_flags()) == cls
    p = prec.choose_precision("auto", "cpu")
    assert (p.name, p.requested, p.device) == (want, "auto", "cpu") and p.reason
    torch_name = {"bf16": "bfloat16", "fp32": "float32"}[want]

    # SFT: the LLaMA-Factory YAML of the shipped CPU config, and its record beside it
    args, record = lf_yaml(tmp_path, monkeypatch)
    assert args["bf16"] is (want == "bf16") and args["fp16"] is False and args["use_cpu"] is True
    assert record["precision"] == want and record["stage"] == "sft" and record["lf_bf16"] is args["bf16"]
    assert "precision (sft): " + want in capsys.readouterr().err
    # RL: the trainer's autocast dtype and the rollout's copy of the weights
    dtype = resolve_compute_dtype("auto", "cpu")
    assert dtype == getattr(torch, torch_name)
    assert resolve_rollout_weights("auto", dtype, "cpu") == ("bfloat16" if want == "bf16" else "shared")
    # evaluation (model.dtype auto, HF and vLLM) and the quickstart's evaluation and start-up line
    assert model_precision(ModelConfig(dtype="auto")).torch_name == torch_name
    assert model_precision(ModelConfig(backend="vllm", path="/ckpt", dtype="auto")).torch_name == torch_name
    assert model_precision(ModelConfig(backend="openai", path="http://127.0.0.1:1")) is None
    assert eval_dtype("auto") == torch_name
    note = machine_note(60)
    assert f"precision {want} (asked auto)" in note and ("every stage runs in float32" in note) is (want == "fp32")


@pytest.mark.parametrize("gpu", list(GPUS))
def test_each_gpu_class_gets_its_precision_in_every_stage(gpu, tmp_path, monkeypatch):
    from r3rag.evaluation.components import model_precision
    from r3rag.evaluation.config import ModelConfig
    from r3rag.train.rl.loop import resolve_compute_dtype, resolve_rollout_weights

    name, bf16, want = GPUS[gpu]
    fake_cpu(monkeypatch, CPUS["avx2"][0])  # the host CPU does not matter for a GPU
    fake_gpu(monkeypatch, name, bf16)
    p = prec.choose_precision("auto", "cuda:0")
    assert (p.name, p.machine) == (want, name)
    args, record = lf_yaml(tmp_path, monkeypatch, "train.use_cpu=false")
    assert args["bf16"] is bf16 and args["fp16"] is False and "use_cpu" not in args
    assert record["device"] == "cuda" and record["precision"] == want
    dtype = resolve_compute_dtype("auto", "cuda")
    assert dtype == (torch.bfloat16 if bf16 else torch.float32)
    assert resolve_rollout_weights("auto", dtype, "cuda") == "shared"
    assert model_precision(ModelConfig(backend="vllm", path="/ckpt", dtype="auto")).torch_name == prec.TORCH_NAMES[want]
    assert model_precision(ModelConfig(dtype="auto", device="cuda")).torch_name == prec.TORCH_NAMES[want]
    if not bf16:  # bf16 asked for on a GPU without it is refused; fp16 asked for is honoured (LLaMA-Factory scales the loss)
        with pytest.raises(ConfigError, match="no native bf16"):
            prec.choose_precision("bf16", "cuda")
        args, _ = lf_yaml(tmp_path, monkeypatch, "train.use_cpu=false", "train.precision=fp16")
        assert args["fp16"] is True and args["bf16"] is False


def test_the_shipped_gpu_recipes_ask_for_bf16_and_get_it_on_a_bf16_gpu(monkeypatch):
    from r3rag.train.sft.config import SFTConfig, llamafactory_args

    fake_gpu(monkeypatch, *GPUS["cuda_bf16"][:2])
    for name in ("r3rag-qwen2.5-7b", "r3rag-llama3.1-8b"):
        args = llamafactory_args(load_config(SFTConfig, ROOT / "configs" / "sft" / f"{name}.yaml"), "/m")
        assert args["bf16"] is True and args["fp16"] is False
    fake_gpu(monkeypatch, *GPUS["cuda_no_bf16"][:2])
    with pytest.raises(ConfigError, match="no native bf16"):
        llamafactory_args(load_config(SFTConfig, ROOT / "configs" / "sft" / "r3rag-qwen2.5-7b.yaml"), "/m")


def test_explicit_overrides_win_and_impossible_ones_fail_loudly(monkeypatch):
    from r3rag.train.rl.loop import resolve_compute_dtype

    fake_cpu(monkeypatch, CPUS["amx"][0])
    assert prec.choose_precision("fp32", "cpu").name == "fp32"
    assert prec.choose_precision("float32", "cpu").torch_name == "float32"
    assert resolve_compute_dtype("float32", "cpu") == torch.float32
    fake_cpu(monkeypatch, CPUS["avx512"][0])
    forced = prec.choose_precision("bf16", "cpu")
    assert forced.name == "bf16" and "6x slower" in forced.reason  # honoured, with the cost said
    assert resolve_compute_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        prec.choose_precision("fp16", "cpu")
    with pytest.raises(ConfigError, match="use auto, fp32, bf16 or fp16"):
        prec.choose_precision("fp8", "cpu")
    fake_gpu(monkeypatch, *GPUS["cuda_no_bf16"][:2])
    with pytest.raises(ConfigError, match="loss scaler"):
        resolve_compute_dtype("fp16", "cuda")


def test_an_unreadable_cpuinfo_means_fp32(monkeypatch):
    monkeypatch.setattr(machine, "read_cpuinfo", lambda cpuinfo=machine.CPUINFO: "")
    p = prec.choose_precision("auto", "cpu")
    assert p.name == "fp32" and "no native bf16" in p.reason


def test_the_quickstart_override_reaches_sft_rl_and_evaluation(tmp_path, monkeypatch):
    """``model.precision: fp32`` on a CPU where auto is bf16: every stage is told, and the stages'
    fingerprints change (a finished bf16 run is not reused as an fp32 one); auto adds nothing."""
    from r3rag.pipeline import training
    from r3rag.pipeline.config import QuickstartConfig
    from r3rag.pipeline.runner import Context
    from r3rag.pipeline.stages import eval_dtype

    fake_cpu(monkeypatch, CPUS["avx512_bf16"][0])
    seen: list[list[str]] = []
    monkeypatch.setattr(training, "_run_stage_program", lambda ctx, name, section, wiring: seen.append(wiring) or tmp_path)
    monkeypatch.setattr(training.checks, "check_sft", lambda *a, **k: {})
    monkeypatch.setattr(training.checks, "check_rl", lambda *a, **k: {})
    monkeypatch.setattr("r3rag.pipeline.stages.checkpoint_of", lambda ctx, stage: "ckpt")
    monkeypatch.setattr("r3rag.pipeline.stages.retrieval_url", lambda ctx: "http://127.0.0.1:1")
    auto = Context(cfg=QuickstartConfig.model_validate({"eval": {"null_control": False}}), work=tmp_path,
                   repo_root=ROOT, echo=print)
    fp32 = Context(cfg=QuickstartConfig.model_validate({"model": {"precision": "fp32"}, "eval": {"null_control": False}}), work=tmp_path, repo_root=ROOT,
                   echo=print)
    training.run_sft(fp32)
    training.run_rl(fp32)
    assert "train.precision=fp32" in seen[0] and "model.compute_dtype=fp32" in seen[1]
    assert eval_dtype("auto", "fp32") == "float32" and eval_dtype("auto", "auto") == "bfloat16"
    assert eval_dtype("bfloat16", "fp32") == "bfloat16"  # eval.dtype set on its own wins
    training.run_sft(auto)
    training.run_rl(auto)
    assert not any("precision" in w or "compute_dtype" in w for w in seen[2] + seen[3])
    assert training.sft_settings(auto) != training.sft_settings(fp32) and "precision" not in training.sft_settings(auto)
    assert training.rl_settings(auto) != training.rl_settings(fp32)


def test_the_rl_trainer_records_its_precision(tmp_path, monkeypatch):
    from tests.rl_helpers import tiny_cfg, tiny_trainer

    fake_cpu(monkeypatch, CPUS["avx512"][0])
    cfg = tiny_cfg("group_norm")
    cfg.model.compute_dtype = "auto"
    t = tiny_trainer(cfg, tmp_path / "rl")
    rec = json.loads((tmp_path / "rl" / prec.RECORD).read_text())
    assert t.dtype == torch.float32 and rec["precision"] == "fp32" and rec["rollout_weights"] == "shared"
    assert "AVX-512 without avx512_bf16" in rec["reason"]
    fake_cpu(monkeypatch, CPUS["avx512_bf16"][0])
    t = tiny_trainer(cfg, tmp_path / "rl2")
    rec = json.loads((tmp_path / "rl2" / prec.RECORD).read_text())
    assert t.dtype == torch.bfloat16 and rec["precision"] == "bf16" and rec["rollout_weights"] == "bfloat16"


def test_the_demo_and_the_hf_loader_follow_the_rule(monkeypatch):
    from r3rag.demo import policies
    from r3rag.demo.config import PolicySection

    fake_cpu(monkeypatch, CPUS["avx512"][0])
    seen: dict = {}
    stub = type("Stub", (), {"tokenizer": None})()
    monkeypatch.setattr(policies, "get_backend", lambda name, **kw: seen.update(kw) or stub)
    assert PolicySection().dtype == "auto"
    assert "(float32, cpu)" in policies._hf_policy(PolicySection(), []).describe()
    assert seen["dtype"] == "float32"
    fake_cpu(monkeypatch, CPUS["amx"][0])
    assert "(bfloat16, cpu)" in policies._hf_policy(PolicySection(), []).describe()


def test_the_hf_loader_resolves_auto(monkeypatch):
    from transformers import AutoModelForCausalLM

    from r3rag.rollout.backends import hf

    seen: dict = {}

    def fake_load(src, dtype=None, **kw):
        seen["dtype"] = dtype
        raise OSError("stop here")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_load)
    for flags, want in CPUS.values():
        fake_cpu(monkeypatch, flags)
        with pytest.raises(hf.ModelLoadError):
            hf.load_model("/no/model", dtype="auto", device="cpu")
        assert seen["dtype"] == (torch.bfloat16 if want == "bf16" else torch.float32)


def test_the_plain_pytorch_sft_follows_the_rule(tmp_path, monkeypatch):
    """benchmark/gpu_training.py's SFT: the autocast dtype and its record come from the rule (the
    stage stops at its first model load here: only the decision is under test)."""
    spec = importlib.util.spec_from_file_location("gpu_training", ROOT / "benchmark" / "gpu_training.py")
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)
    from r3rag.train.sft import base_model

    monkeypatch.setattr(base_model, "ensure_hf_folder", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    for cls in ("avx512", "avx512_bf16"):
        fake_cpu(monkeypatch, CPUS[cls][0])
        work = tmp_path / cls
        with pytest.raises(RuntimeError, match="stop"):
            gt.sft(work, "smollm2", "cpu", 1, 1, 1e-4, 0)
        assert json.loads((work / "sft" / prec.RECORD).read_text())["precision"] == CPUS[cls][1]
