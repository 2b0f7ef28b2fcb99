"""Run LLaMA-Factory SFT from an r3rag config, in LLaMA-Factory's own virtual environment.

1. the base model becomes an HF folder (a GGUF file is converted once, cached:
   :mod:`r3rag.train.sft.base_model`);
2. the dataset folder is checked (``dataset_info.json`` names the dataset, the files exist) and
   every example measured: one longer than ``data.cutoff_len`` stops the run unless
   ``data.drop_longer`` leaves it out (:mod:`r3rag.train.sft.lengths`);
3. ``OUTPUT_DIR/r3rag_sft.yaml`` gets LLaMA-Factory's YAML (:func:`r3rag.train.sft.config.llamafactory_args`)
   and ``OUTPUT_DIR/r3rag_config.yaml`` our config;
4. ``VENV/bin/python -m r3rag.train.sft.lf_launch r3rag_sft.yaml`` runs it (our template is
   registered in that process first), or ``VENV/bin/torchrun --nnodes ... -m r3rag.train.sft.lf_launch``
   when ``launch.nproc_per_node * launch.nnodes > 1`` (DeepSpeed reads ``train.deepspeed``);
5. a run killed at any point resumes from its last checkpoint when started again (LLaMA-Factory
   finds ``checkpoint-*`` in the output folder); ``OUTPUT_DIR/r3rag_sft_done.json`` marks a finished
   run (with wall time and tokens/s), after which the command does nothing unless ``force``.

The output folder is a normal HF checkpoint (model, tokenizer with the chat template) that
evaluation, the demo and RL take as ``--model OUTPUT_DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from r3rag.config import dump_config
from r3rag.errors import ConfigError, R3RagError
from r3rag.train.sft.config import SFTConfig, llamafactory_args, resolve_precision

DONE = "r3rag_sft_done.json"
ROOT = Path(__file__).resolve().parents[3]


class SFTError(R3RagError):
    """The SFT run could not start or failed."""


def venv_path(cfg: SFTConfig) -> Path:
    return Path(cfg.launch.venv or os.environ.get("R3RAG_LLAMAFACTORY_VENV") or ROOT / ".venvs" / "llamafactory")


def check_dataset(cfg: SFTConfig) -> None:
    folder = Path(cfg.data.dataset_dir)
    info_path = folder / "dataset_info.json"
    if not info_path.is_file():
        raise ConfigError(f"data.dataset_dir {folder}: no dataset_info.json (build it: train/build_coldstart.py --out {folder})")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    for name in [n.strip() for n in cfg.data.dataset.split(",") if n.strip()]:
        if name not in info:
            raise ConfigError(f"data.dataset {name!r} is not in {info_path} (has: {', '.join(sorted(info))})")
        target = folder / info[name]["file_name"]
        files = list(target.glob("*.json*")) if target.is_dir() else [target]
        if not files or not all(f.is_file() and f.stat().st_size > 0 for f in files):
            raise ConfigError(f"{target}: dataset {name!r} is empty or missing")


def command(cfg: SFTConfig, lf_yaml: Path) -> list[str]:
    venv = venv_path(cfg)
    py = venv / "bin" / "python"
    if not py.is_file():
        raise SFTError(f"LLaMA-Factory environment missing at {venv}: run bash train/envs/llamafactory.sh")
    L = cfg.launch
    if L.nproc_per_node * L.nnodes > 1:
        return [str(venv / "bin" / "torchrun"), "--nnodes", str(L.nnodes), "--node_rank", str(L.node_rank),
                "--nproc_per_node", str(L.nproc_per_node), "--master_addr", L.master_addr,
                "--master_port", str(L.master_port), "-m", "r3rag.train.sft.lf_launch", str(lf_yaml)]
    return [str(py), "-m", "r3rag.train.sft.lf_launch", str(lf_yaml)]


def prepare(cfg: SFTConfig, lengths: dict[str, Any] | None = None,
            dry_run: bool = False) -> tuple[list[str], dict[str, str], Path]:
    """Write the YAMLs and return ``(command, environment, output folder)``; ``lengths``, when
    given, receives the length check's report (:mod:`r3rag.train.sft.lengths`). A dry run whose
    tokenizer cannot be loaded here (a hub id on a machine without the model) says so in one line
    and writes the YAMLs without the length check; training never starts without it."""
    from r3rag.train.sft.base_model import ensure_hf_folder
    from r3rag.train.sft.lengths import check_lengths

    check_dataset(cfg)
    model = ensure_hf_folder(cfg.model)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = check_lengths(cfg, model, out)
    except OSError as err:
        if not dry_run:
            raise
        print(f"dry run: example lengths not checked, the tokenizer of {model} is not available here "
              f"({type(err).__name__}); training checks them first", file=sys.stderr, flush=True)
        from r3rag.train.sft.lengths import LengthReport

        report = LengthReport(examples=0, longest=0, cutoff_len=int(cfg.data.cutoff_len or 0), longer=0,
                              dataset_dir=str(cfg.data.dataset_dir))
    if report.dropped:
        print(f"data: left out {report.dropped} of {report.examples} examples longer than data.cutoff_len "
              f"{report.cutoff_len} (longest {report.longest} tokens); training reads {report.dataset_dir}",
              file=sys.stderr, flush=True)
    if lengths is not None:
        lengths.update(report.to_dict())
    precision = resolve_precision(cfg)
    args = llamafactory_args(cfg, str(model), precision)
    args["dataset_dir"] = str(Path(report.dataset_dir).resolve())
    args["output_dir"] = str(out.resolve())
    lf_yaml = out / "r3rag_sft.yaml"
    lf_yaml.write_text(yaml.safe_dump(args, sort_keys=False), encoding="utf-8")
    (out / "r3rag_config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    precision.write(out, "sft", lf_bf16=args["bf16"], lf_fp16=args["fp16"])  # the YAML's keys, beside why
    env = dict(os.environ)
    env["R3RAG_OBSERVATION_ROLE"] = cfg.observation_role
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cfg.launch.threads:
        env["OMP_NUM_THREADS"] = str(cfg.launch.threads)
    return command(cfg, lf_yaml), env, out


def train_tokens(cfg: SFTConfig) -> int:
    """Tokens in the training data as LLaMA-Factory counts them (approx.: trajectories' sizes)."""
    folder = Path(cfg.data.dataset_dir) / "decisions"
    total = 0
    for p in sorted(folder.glob("part-*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            if d.get("kept"):
                total += d.get("prompt_tokens", 0) + d.get("generated_tokens", 0) + d.get("env_tokens", 0)
    return total


def run_sft(cfg: SFTConfig, force: bool = False, log: Any = None) -> dict[str, Any]:
    out = Path(cfg.output_dir)
    done = out / DONE
    if done.is_file() and not force:
        return json.loads(done.read_text(encoding="utf-8")) | {"skipped": "already finished (force to redo)"}
    lengths: dict[str, Any] = {}
    cmd, env, out = prepare(cfg, lengths)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT if log else None)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SFTError(f"LLaMA-Factory exited with {proc.returncode} (output above{'; log: ' + str(getattr(log, 'name', '')) if log else ''})")
    state = _trainer_state(out)
    tokens = state.get("num_input_tokens_seen") or 0
    result = {"output_dir": str(out), "wall_s": round(wall, 1), "train_runtime_s": state.get("train_runtime"),
              "global_step": state.get("global_step"), "epochs": state.get("epoch"), "final_loss": state.get("train_loss"),
              "dataset_tokens": train_tokens(cfg),
              "examples": {k: lengths[k] for k in ("examples", "longest", "cutoff_len", "dropped")}}
    if tokens:
        result["tokens_seen"] = tokens
    done.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _trainer_state(out: Path) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name in ("train_results.json", "trainer_state.json"):
        p = out / name
        if p.is_file():
            data = json.loads(p.read_text(encoding="utf-8"))
            info.update({k: v for k, v in data.items() if not isinstance(v, (list, dict))})
    return info
