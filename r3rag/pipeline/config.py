"""Settings of the training quickstart (``configs/quickstart/*.yaml``; ``--set key=value`` overrides).

One file says, for every stage, what it runs on and how big it is. The training stages
(cold start, SFT, RL) are separate programs with their own configs (``configs/coldstart``,
``configs/sft``, ``configs/rl``); this file names which of their configs to use and adds
``--set`` overrides for them, while the pipeline itself fills in the wiring (where the world,
the retrieval service, the previous stage's checkpoint and the output folder are) and gives every
stage the same rollout profile (``profile``: cold start's, RL's and evaluation's budgets, SFT's
cutoff).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from r3rag.config import Section


class WorldSection(Section):
    seed: int = Field(0, description="world seed (the same files every time for a seed)")
    size: str = Field("small", description="tiny | small | medium | large (held-out questions grow with it)")
    clusters: int | None = Field(None, ge=1, description="override the size's cluster count (tests)")
    questions_per_cluster: float | None = Field(None, ge=0, description="override the size's questions per cluster (tests)")


class RetrievalSection(Section):
    bm25_backend: str = Field("numpy", description="BM25 scoring in the service: numpy (no compile) | numba | auto")


class ModelSection(Section):
    base: str = Field("smollm2", description="the model every stage starts from: 'smollm2' (packaged), a folder or a .gguf")
    threads: int | None = Field(None, ge=1, description="torch threads in this process (None: torch's choice)")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="every stage's precision: auto (the stages' own auto: bf16 on CPUs with avx512_bf16 / amx_bf16, "
        "fp32 elsewhere, r3rag.precision) | fp32 | bf16 (passed to SFT, RL and evaluation)")


class TrainStageSection(Section):
    """A training stage run as its own program: ``python SCRIPT --config CONFIG --set ...``."""

    enabled: bool = True
    script: str = Field("", description="the stage's program, relative to the repository root")
    config: str | None = Field(None, description="the stage's own YAML config (relative to the repository root)")
    set: list[str] = Field(default_factory=list, description="extra --set overrides passed to the stage's program")
    timeout_s: float | None = Field(None, gt=0, description="give up on the stage after this many seconds")
    out_arg: str = Field("--out", description="how the program is told its output folder: a flag, or a config key set with --set")


class CheckpointingStageSection(TrainStageSection):
    """A training stage that writes resume checkpoints beside its final model (SFT, RL)."""

    keep_resume_checkpoints: bool = Field(
        False, description="keep the stage's resume checkpoints once it has finished (SmolLM2 with its optimizer "
        "state: about 1.6 GB each; the final model is always kept)")


class ColdstartSection(TrainStageSection):
    script: str = "train/build_coldstart.py"
    config: str | None = "configs/coldstart/world-oracle.yaml"
    limit: int | None = Field(None, ge=1, description="teacher questions from the world's train split (None: all)")
    min_kept: int = Field(1, ge=1, description="fewer kept trajectories than this: the stage produced nothing usable")


class SftSection(CheckpointingStageSection):
    script: str = "train/sft.py"
    out_arg: str = "output_dir"
    config: str | None = "configs/sft/world-smollm2-cpu.yaml"
    require_loss_drop: bool = Field(True, description="fail the stage when the training loss did not fall")


class RlSection(CheckpointingStageSection):
    script: str = "train/rl.py"
    config: str | None = "configs/rl/world_sft_grpo.yaml"
    start: Literal["sft", "base"] = Field(
        "sft", description="what RL starts from: sft (the SFT stage's checkpoint) | base (model.base, prompted: no cold "
        "start and no SFT, as R1-Searcher trains; the preset then leaves coldstart and sft out of its stages)")
    monitor_split: str = Field("test", description="world split RL evaluates on before and after training when "
                               "reward_check is 0 (never eval.split)")
    reward_check: int = Field(
        32, ge=0, description="RL's own before/after check: this many of its first training questions answered "
        "greedily by SFT and by RL, scored by RL's reward recipe; the report pairs the two (0: check held-out "
        "accuracy on monitor_split instead)")
    require_signal: bool = Field(True, description="fail the stage when the reward stayed flat and every group was filtered")


class EvalSection(Section):
    config: str = Field("configs/evaluate/embedded-cpu.yaml", description="evaluation config every run starts from")
    split: str = Field("dev", description="held-out world split (no stage trains on it: train is the training split)")
    limit: int | None = Field(300, ge=1, description="the first N held-out questions after skip (None: all)")
    skip: int = Field(0, ge=0, description="leave out the split's first N questions, e.g. those consulted while "
                      "choosing a recipe, so that the claims rest on questions nothing was chosen on")
    base_methods: list[str] = Field(
        default_factory=lambda: ["rag"],
        description="prompted methods of the base model; the best by EM is the table's 'base' row",
    )
    extra_methods: list[str] = Field(
        default_factory=list, description="more prompted methods evaluated and listed (oracle, direct, r1searcher ...)"
    )
    base_prompt_variant: str = Field("fewshot", description="instructions for the untrained model in a step format")
    trained_method: str = Field("r3rag_steps", description="the format the trained models are evaluated in")
    trained_prompt_variant: str = Field("standard", description="instructions for trained checkpoints (what they trained on)")
    batch_size: int = Field(32, ge=1, description="questions per engine call and rows per forward pass")
    dtype: str = Field("auto", description="model dtype for every run: auto (model.precision; its auto is bfloat16 on CPUs "
                       "with native bf16, measured 1.5x cheaper there, float32 elsewhere) | float32 | bfloat16")
    workers: int = Field(1, ge=1, description="processes per evaluation run, each on its shard of the questions with "
                         "threads/workers torch threads, merged afterwards (2 on 2 cores: 1.21x faster than one process "
                         "of 2 threads, the same EM; in bf16 some predictions change with the batch; docs/results/quickstart.md)")
    null_control: bool = Field(
        True, description="also evaluate RL's null control, a copy of SFT moved by RL's update with a random sign per "
        "parameter (one more trained-model evaluation: about 4 min for 300 questions on 2 cores)")
    set: list[str] = Field(default_factory=list, description="extra evaluation overrides for every run")
    trained_set: list[str] = Field(default_factory=list, description="extra evaluation overrides for the SFT/RL runs "
                                   "(after the profile's budgets, which every run gets)")


class ReportSection(Section):
    bootstrap: int = Field(1000, ge=100, description="bootstrap resamples for every interval")
    seed: int = 0
    examples: int = Field(2, ge=0, description="questions shown before and after training")
    fast_note: bool = Field(False, description="say that the intervals are wider (the --fast preset)")
    require_claims: bool = Field(False, description="exit non-zero when a learning claim does not hold (SFT > base; "
                                 "RL moved its training reward and did no harm beyond the null control)")
    budget_min: float | None = Field(None, gt=0, description="the preset's time budget after setup (the report compares)")
    kind: Literal["training", "from_base"] = Field(
        "training", description="training: base / SFT / RL and their claims (r3rag.pipeline.report) | from_base: RL from "
        "the prompted base against that base, format-valid rate, retrievals by hop count, EM and their claims "
        "(r3rag.pipeline.report_from_base)")


class QuickstartConfig(Section):
    preset: str = Field("full", description="the preset's name, printed in the report")
    work: str = Field("runs/quickstart", description="working folder: one subfolder per stage")
    stages: list[str] = Field(
        default_factory=lambda: ["world", "index", "coldstart", "sft", "rl", "eval", "report"],
        description="stages run by default (--stages picks a subset)",
    )
    profile: str = Field("configs/rollout/world-smollm2.yaml", description="rollout profile (turn, trajectory and context "
                         "budgets, steps, documents) given to cold start, SFT (its cutoff), RL and every evaluation run")
    world: WorldSection = Field(default_factory=WorldSection)
    retrieval: RetrievalSection = Field(default_factory=RetrievalSection)
    model: ModelSection = Field(default_factory=ModelSection)
    coldstart: ColdstartSection = Field(default_factory=ColdstartSection)
    sft: SftSection = Field(default_factory=SftSection)
    rl: RlSection = Field(default_factory=RlSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    report: ReportSection = Field(default_factory=ReportSection)
