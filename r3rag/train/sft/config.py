"""Settings of an SFT run (``configs/sft/*.yaml``) and the LLaMA-Factory YAML written from them.

Our config names the model (a folder, a hub name, a ``.gguf`` file or ``smollm2``), the cold-start
folder and dataset, the training recipe and how to launch; its cutoff follows the rollout profile the
data was written under (``rollout_profile``), so no chain is cut; :func:`llamafactory_args` turns it into
LLaMA-Factory's own keys (``model_name_or_path``, ``stage: sft``, ``template``, ``dataset``,
``dataset_dir``, ``cutoff_len``, ...). Anything else LLaMA-Factory knows goes under ``extra:``
and is passed through unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from r3rag.config import Section
from r3rag.precision import Precision, choose_precision

#: the cutoff without a rollout profile (R3-RAG's recipes)
DEFAULT_CUTOFF_LEN = 4096


class DataSection(Section):
    dataset_dir: str = Field("runs/coldstart/world-r3rag_steps", description="cold-start output folder (has dataset_info.json)")
    dataset: str = Field("r3rag_steps_sharegpt", description="a name in its dataset_info.json (or several, comma-separated)")
    cutoff_len: int | None = Field(None, ge=1, description="longest example in tokens (LLaMA-Factory cuts longer ones, so "
                                   "train/sft.py refuses them); unset: the rollout profile's total budget + 16, else 4096")
    drop_longer: bool = Field(False, description="leave out (and count) examples longer than cutoff_len instead of refusing the dataset")
    max_samples: int | None = None
    preprocessing_num_workers: int | None = None


class TrainSection(Section):
    finetuning_type: Literal["full", "lora", "freeze"] = "full"
    num_train_epochs: float = 3.0
    max_steps: int = Field(-1, description="stop after this many optimiser steps (-1: epochs decide)")
    learning_rate: float = 1e-5
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.1
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 8
    precision: Literal["auto", "bf16", "fp32", "fp16"] = Field(
        "auto", description="auto: bf16 on a GPU with native bf16 or a CPU with avx512_bf16 / amx_bf16 (measured faster "
        "there), else fp32 (r3rag.precision); fp16 only on a GPU")
    deepspeed: str | None = Field(None, description="DeepSpeed config JSON (ZeRO-3 for 7-8B models)")
    gradient_checkpointing: bool = False
    save_steps: int = 500
    save_total_limit: int | None = 2
    logging_steps: int = 10
    seed: int = 42
    use_cpu: bool = False
    max_minutes: float | None = Field(None, gt=0, description="stop cleanly (model saved) after this much training time")
    fit_schedule: bool = Field(True, description="with max_minutes: time the first steps and, when max_steps would not fit, "
                               "shorten the learning-rate schedule to the steps that do (it ends decayed, not cut off)")


class LaunchSection(Section):
    nproc_per_node: int = Field(1, ge=1, description="processes (GPUs) per node; >1 launches torchrun")
    nnodes: int = Field(1, ge=1)
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    venv: str | None = Field(None, description="LLaMA-Factory's venv (default: $R3RAG_LLAMAFACTORY_VENV or .venvs/llamafactory)")
    threads: int | None = Field(None, description="torch/OMP threads on CPU (default: all cores)")


class SFTConfig(Section):
    model: str = Field("smollm2", description="folder, hub name, .gguf file or smollm2 (converted to a folder once, cached)")
    template: str = Field("r3rag", description="r3rag: the model's own chat template cut at the rollout's turn boundaries")
    observation_role: str = Field("tool", description="must equal the rollout's rollout.observation_role")
    rollout_profile: str | None = Field(None, description="the rollout profile the data was written under "
                                        "(configs/rollout/*.yaml): data.cutoff_len defaults to its total budget + 16")
    output_dir: str = "runs/sft/world-smollm2"
    data: DataSection = DataSection()
    train: TrainSection = TrainSection()
    launch: LaunchSection = LaunchSection()
    extra: dict[str, Any] = Field(default_factory=dict, description="more LLaMA-Factory keys, passed through")

    @model_validator(mode="after")
    def _cutoff(self) -> "SFTConfig":
        if self.data.cutoff_len is None:
            if self.rollout_profile:
                from r3rag.rollout.profile import load_profile

                self.data.cutoff_len = load_profile(self.rollout_profile).sft_cutoff_len()
            else:
                self.data.cutoff_len = DEFAULT_CUTOFF_LEN
        return self


def sft_device(cfg: SFTConfig) -> str:
    """Where LLaMA-Factory trains: the GPU when torch sees one and ``train.use_cpu`` is off."""
    from r3rag.precision import default_device

    return "cpu" if cfg.train.use_cpu else default_device()


def resolve_precision(cfg: SFTConfig) -> Precision:
    """The run's precision, by the one rule (:func:`r3rag.precision.choose_precision`)."""
    return choose_precision(cfg.train.precision, sft_device(cfg))


def llamafactory_args(cfg: SFTConfig, model_path: str, precision: Precision | None = None) -> dict[str, Any]:
    t, d = cfg.train, cfg.data
    precision = (precision or resolve_precision(cfg)).name
    args: dict[str, Any] = {
        "model_name_or_path": model_path,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": t.finetuning_type,
        "template": cfg.template,
        "dataset": d.dataset,
        "dataset_dir": d.dataset_dir,
        "cutoff_len": d.cutoff_len,
        "overwrite_cache": True,
        "output_dir": cfg.output_dir,
        "num_train_epochs": t.num_train_epochs,
        "max_steps": t.max_steps,
        "learning_rate": t.learning_rate,
        "lr_scheduler_type": t.lr_scheduler_type,
        "warmup_ratio": t.warmup_ratio,
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "save_steps": t.save_steps,
        "logging_steps": t.logging_steps,
        "seed": t.seed,
        "report_to": "none",
        "plot_loss": False,
        "save_only_model": False,  # optimizer state too: a killed run resumes exactly
        "include_num_input_tokens_seen": True,  # tokens/s in trainer_state.json
    }
    if t.save_total_limit is not None:
        args["save_total_limit"] = t.save_total_limit
    if d.max_samples is not None:
        args["max_samples"] = d.max_samples
    if d.preprocessing_num_workers is not None:
        args["preprocessing_num_workers"] = d.preprocessing_num_workers
    if t.deepspeed:
        args["deepspeed"] = t.deepspeed
    # LLaMA-Factory turns gradient checkpointing on by default: only where asked (it costs compute)
    args["disable_gradient_checkpointing"] = not t.gradient_checkpointing
    if t.use_cpu:
        args["use_cpu"] = True
    if t.max_minutes:
        args["r3rag_max_minutes"] = t.max_minutes
        args["r3rag_fit_schedule"] = t.fit_schedule
    args.update(cfg.extra)
    return args
