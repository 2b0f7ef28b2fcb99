#!/usr/bin/env python
"""The quickstart's training on one GPU: world -> cold start -> SFT -> RL -> evaluation of the base, SFT, RL and
RL's null control on the same 300 held-out questions.

    python benchmark/gpu_training.py --work runs/gpu --device cuda                # one GPU (benchmark/gpu_checks.sh runs it)
    python benchmark/gpu_training.py --work runs/gpu-tiny --device cpu --tiny     # the same code in a minute (tests)

It answers what the CPU quickstart cannot: does RL beat its SFT start when it gets several times
the 4-6 iterations of 32 trajectories that 15 CPU minutes allow? The stages, in order (each is
timed; the first that fails ends the run with exit status 1, its name and error in the summary):

1. ``world+index``: the embedded world (``--seed``, medium size: 940 dev questions, none trained
   on) and its BM25 index, searched in this process (no service);
2. ``coldstart``: ``configs/coldstart/world-oracle.yaml``, the world's teacher on
   ``--coldstart-limit`` train questions, correct chains kept (as ``make quickstart``);
3. ``sft``: plain PyTorch on the kept trajectories' own ids and loss masks
   (:func:`r3rag.train.sft.chat_slots.sft_view`, the tokens LLaMA-Factory trains on by the SFT
   contract test) with LLaMA-Factory's schedule of ``configs/sft/world-smollm2-cpu.yaml`` (AdamW,
   cosine with 10% warm-up, gradient norm clipped at 1, 150 steps of 2 chains, lr 2e-4). It
   stands in for ``train/sft.py`` because LLaMA-Factory's environment is not on a GPU machine
   without network; the quickstart proper always uses LLaMA-Factory;
4. ``rl``: ``configs/rl/world_sft_grpo.yaml`` (R3-RAG reward, group normalisation) at
   ``--questions-per-iter`` x ``--n-samples`` trajectories per iteration for ``--rl-minutes``,
   with its own check on its first ``--reward-check`` training questions before and after
   (greedy, scored by its reward recipe: did RL move the reward it optimised?);
5. ``null-control``: SFT moved by RL's update with a random sign per parameter
   (:func:`r3rag.train.rl.update_noise.random_sign_update`);
6. ``eval``: the prompted base (standard RAG, as the quickstart's base row), SFT, RL and the null
   control on the same ``--eval-limit`` dev questions after the first ``--eval-skip`` (the
   quickstart's positions 301-600), one batch each, through :mod:`r3rag.evaluation.runner`.

The batch size follows the cost model in docs/results/gpu_checks.md: 8 x 8 = 64 trajectories per
iteration, 32 per optimizer step, about 12-22 s per iteration on an H100/H200 by the model, so
that the 2-minute time box holds 5-10 iterations (10-20 optimizer steps) even if the model's
pessimistic end holds; the last GPU run's 64 x 8 did not finish one iteration in 225 s.

``WORK/summary.json`` gets the stage times, the SFT loss, the RL iterations and phase times, the
training reward before and after, and on the held-out questions SFT - base (paired), RL - SFT
(replicate-aware interval: :mod:`r3rag.evaluation.replicates`) and RL - null control, each with
its 95% interval, plus the claims of the quickstart's report; ``figures`` holds them as lines.
Every stage reuses what an earlier run of the same ``--work`` finished (RL resumes from its
checkpoint, an evaluation from its rows).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[gpu_training {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_world_and_index(work: Path, seed: int, size: str) -> tuple[Path, Path]:
    from r3rag.retrieval.bm25_index import build_bm25
    from r3rag.retrieval.manifest import MANIFEST_NAME
    from r3rag.world import build_world

    world, index = work / "world", work / "index"
    if not (world / "manifest.json").is_file():
        build_world(world, seed=seed, size=size, progress=False)
    if not (index / MANIFEST_NAME).is_file():
        build_bm25(world / "corpus.jsonl", index, name="world", show_progress=False)
    return world, index


def cold_start(work: Path, world: Path, index: Path, model: str, limit: int) -> dict[str, Any]:
    from r3rag.config import load_config
    from r3rag.train.coldstart.builder import build_coldstart
    from r3rag.train.coldstart.config import ColdStartConfig

    cfg = load_config(ColdStartConfig, ROOT / "configs/coldstart/world-oracle.yaml", [
        f"data.questions={world / 'train.jsonl'}", f"data.limit={limit}", f"retriever.index_dir={index}",
        f"teacher.tokenizer={model}", f"output.dir={work / 'coldstart'}", "output.progress=false"])
    return build_coldstart(cfg)


def sft_examples(coldstart_dir: Path, tok: Any) -> list[tuple[list[int], list[int]]]:
    """``(ids, loss_mask)`` of every kept cold-start chain, as LLaMA-Factory tokenises them."""
    from r3rag.rollout.trajectory import Trajectory
    from r3rag.train.coldstart.store import read_rows
    from r3rag.train.sft.chat_slots import derive_slots, sft_view

    eot = list(tok(derive_slots(tok).eot, add_special_tokens=False).input_ids)
    return [sft_view(Trajectory.from_dict(r), eot) for r in read_rows(coldstart_dir, "trajectories")]


def sft_loss(model: Any, batch: list[tuple[list[int], list[int]]], pad_id: int, device: str) -> Any:
    """Mean next-token cross-entropy over the trained (mask 1) tokens of a right-padded batch."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (x, m) in enumerate(batch):
        ids[row, :len(x)] = torch.tensor(x)
        attn[row, :len(x)] = 1
        labels[row, :len(x)] = torch.tensor([t if keep else -100 for t, keep in zip(x, m)])
    ids, labels, attn = ids.to(device), labels.to(device), attn.to(device)            # [B, T]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()          # [B, T-1, V]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                             ignore_index=-100)


def sft(work: Path, base: str, device: str, steps: int, batch: int, lr: float, seed: int,
        precision: str = "auto") -> dict[str, Any]:
    """Full fine-tuning on the cold-start chains: ``steps`` optimizer steps of ``batch`` chains, the
    forward pass under autocast in the precision the one rule picks (:mod:`r3rag.precision`; weights
    and optimizer state stay float32)."""
    from r3rag.precision import choose_precision

    import torch
    from transformers import AutoModelForCausalLM, get_cosine_schedule_with_warmup

    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.train.sft.base_model import ensure_hf_folder

    out = work / "sft"
    done = out / "gpu_sft_done.json"
    if done.is_file():
        return json.loads(done.read_text())
    chosen = choose_precision(precision, device)
    chosen.write(out, "sft (plain PyTorch)")
    folder = ensure_hf_folder(base, cache=work / "models")
    tok = load_tokenizer(str(folder))
    examples = sft_examples(work / "coldstart", tok)
    random.Random(seed).shuffle(examples)
    examples = examples[:steps * batch]
    steps = math.ceil(len(examples) / batch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = get_cosine_schedule_with_warmup(opt, math.ceil(0.1 * steps), steps)
    use_autocast = chosen.name != "fp32"
    losses, t0, tokens = [], time.perf_counter(), 0
    for s in range(steps):
        chunk = examples[s * batch:(s + 1) * batch]
        with torch.autocast(device_type=device.split(":")[0], dtype=chosen.dtype, enabled=use_autocast):
            loss = sft_loss(model, chunk, tok.pad_token_id if tok.pad_token_id is not None else 0, device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        tokens += sum(len(ids) for ids, _ in chunk)
    seconds = time.perf_counter() - t0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    summary = {"chains": len(examples), "steps": steps, "loss_first": losses[0], "loss_last": losses[-1],
               "loss_last10_mean": round(sum(losses[-10:]) / len(losses[-10:]), 4), "seconds": round(seconds, 1),
               "tokens_per_s": round(tokens / seconds, 1), "precision": chosen.name, "losses": losses}
    done.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def rl(work: Path, world: Path, index: Path, args: argparse.Namespace) -> Path:
    from r3rag.train.rl.loop import run_schedule

    world_keys = [f"world_dir={world}", f"world_seed={args.seed}", f"world_size={args.size}", "name=world"]
    overrides = [
        f"model.path={work / 'sft'}", f"model.device={args.device}", f"model.threads={args.threads}",
        f"model.max_batch_size={max(args.questions_per_iter * args.n_samples, args.reward_check)}",
        *[f"data.{k}" for k in world_keys], "data.split=train",
        "retriever.urls=[]", f"retriever.index_dir={index}",
        "eval.questions=training", f"eval.dataset.limit={args.reward_check}", f"eval.batch_size={args.reward_check}",
        f"train.questions_per_iter={args.questions_per_iter}", f"rollout.n_samples={args.n_samples}",
        f"algo.train_batch_size={args.train_batch}", f"algo.micro_batch_tokens={args.micro_batch_tokens}",
        f"train.max_minutes={args.rl_minutes}", f"train.iterations={args.rl_iterations}",
        "train.eval_at_start=true", "train.eval_at_end=true", "train.eval_every=0", "train.progress=false",
        f"model.compute_dtype={args.precision}", *args.set,
    ]
    return run_schedule(ROOT / "configs/rl/world_sft_grpo.yaml", overrides, work / "rl")


def rl_summary(out: Path) -> dict[str, Any]:
    """The RL run: iterations, trajectories, phase times, training reward per iteration, and its
    check on its own training questions before and after (paired)."""
    from r3rag.pipeline.checks import reward_check
    from r3rag.train.rl.metrics import METRICS, read_records

    train = [r for r in read_records(out / METRICS) if r.get("kind") == "train"]
    phases = sorted({k for r in train for k in r if k.startswith("time/")})
    return {
        "iterations": len(train),
        "trajectories": int(sum(r.get("batch/trajectories", 0) for r in train)),
        "optimizer_steps": int(sum(r.get("batch/optimizer_steps", 0) for r in train)),
        "reward_per_iteration": [round(float(r.get("reward/total", 0.0)), 4) for r in train],
        "phase_seconds_mean": {k: round(sum(r.get(k, 0.0) for r in train) / len(train), 2) for k in phases} if train else {},
        "reward_check": reward_check(out),
    }


def null_control(work: Path) -> Path:
    from r3rag.pipeline.training import write_null_control

    return write_null_control(work / "sft", work / "rl" / "final", work / "rl" / "null-control")


#: the quickstart's evaluation of trained checkpoints (configs/quickstart/full.yaml: eval.trained_set)
TRAINED_EVAL = ["method.name=r3rag_steps", "rollout.prompt_variant=standard", "rollout.max_steps=5",
                "rollout.max_turn_tokens=80", "rollout.doc_max_chars=512"]
BASE_EVAL = ["method.name=rag", "rollout.prompt_variant=fewshot"]


def evaluate(work: Path, world: Path, index: Path, name: str, model: str, method: list[str],
             args: argparse.Namespace) -> list[dict[str, Any]]:
    """One evaluation run into ``WORK/eval/NAME`` (resumed by its own rows); returns its rows.
    Rows the infrastructure ended (no retrieval, a dead backend) are not scores: any is an error."""
    from r3rag.config import load_config
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.evaluation.predictions import load_rows
    from r3rag.evaluation.runner import run_evaluation

    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    overrides = [
        "dataset.name=world", f"dataset.world_dir={world}", f"dataset.world_seed={args.seed}", f"dataset.world_size={args.size}",
        "dataset.split=dev", f"dataset.limit={args.eval_limit}", *([f"dataset.skip={args.eval_skip}"] if args.eval_skip else []),
        "retriever.urls=[]", f"retriever.index_dir={index}", f"model.path={model}", f"model.device={args.device}",
        f"model.dtype={dtype}", f"model.max_batch_size={args.eval_limit}", f"run.batch_size={args.eval_limit}",
        f"run.bootstrap={args.bootstrap}", "run.progress=false", *method,
    ]
    cfg = load_config(EvaluationConfig, ROOT / "configs/evaluate/embedded-cpu.yaml", overrides)
    outcome = run_evaluation(cfg, work / "eval" / name)
    rows = load_rows(Path(outcome.out_dir) / "predictions.jsonl", repair=False)
    infra = [r for r in rows if r.get("stop_reason") in ("retrieval_failed", "backend_error")]
    if infra:
        raise RuntimeError(f"evaluation {name}: {len(infra)} of {len(rows)} questions ended by the infrastructure "
                           f"({infra[0]['stop_reason']}); rerun to retry them")
    if len(rows) < args.eval_limit:
        raise RuntimeError(f"evaluation {name}: {len(rows)} rows, {args.eval_limit} asked for")
    return rows


def effects(rows: dict[str, list[dict[str, Any]]], rl: dict[str, Any], resamples: int) -> dict[str, Any]:
    """SFT - base, RL - SFT and RL - null control on the held-out questions, and the claims."""
    from r3rag.evaluation.paired import means_with_ci, paired_differences
    from r3rag.evaluation.replicates import control_differences, replicate_differences
    from r3rag.pipeline.checks import claim, rl_claim
    from r3rag.pipeline.report import GOALS

    sft_vs_base = paired_differences(rows["base"], rows["sft"], resamples=resamples)
    rl_vs_sft = replicate_differences(rows["sft"], [rows["rl"]], resamples=resamples)
    rl_vs_null = control_differences(rows["sft"], [rows["rl"]], [rows["null"]], resamples=resamples)
    claims = [claim("sft_vs_base", "SFT", "the prompted base", sft_vs_base["em"], GOALS["sft_vs_base"]),
              rl_claim(rl.get("reward_check"), rl_vs_null["em"])]
    return {"means": {k: means_with_ci(v, resamples) for k, v in rows.items()},
            "sft_vs_base": sft_vs_base, "rl_vs_sft": rl_vs_sft, "rl_vs_null": rl_vs_null, "claims": claims}


def figure_lines(s: dict[str, Any]) -> list[str]:
    """The run's figures, one line each (gpu_checks.sh puts them in its summary)."""
    def d(v: dict[str, Any]) -> str:
        return f"{v['diff']:+.1f} [{v['ci95'][0]:+.1f}, {v['ci95'][1]:+.1f}]"

    e, rl = s["effects"], s["rl"]
    n = e["sft_vs_base"]["em"]["n"]
    lines = [f"held-out EM on {n} dev questions: " + ", ".join(f"{k} {v['em']['mean']:.1f}" for k, v in e["means"].items()),
             f"SFT - base: {d(e['sft_vs_base']['em'])} EM",
             f"RL - SFT: {d(e['rl_vs_sft']['em'])} EM",
             f"RL - null control: {d(e['rl_vs_null']['em'])} EM",
             f"RL: {rl['iterations']} iterations, {rl['trajectories']} trajectories, {rl['optimizer_steps']} optimizer steps"]
    check = rl.get("reward_check")
    if check:
        lines.append(f"training reward on {check['n']} of RL's own questions: {check['before']:.3f} -> {check['after']:.3f}, "
                     f"paired {check['diff']:+.3f} [{check['ci95'][0]:+.3f}, {check['ci95'][1]:+.3f}]")
    return lines + [c["text"] for c in e["claims"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="work folder (reused: finished stages are skipped)")
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="tiny world, tiny random model, a few steps: the code path on a CPU")
    p.add_argument("--model", default="smollm2", help="base model: 'smollm2' (packaged), a .gguf file or an HF folder")
    p.add_argument("--seed", type=int, default=0, help="world seed (default: %(default)s)")
    p.add_argument("--size", default="medium", help="world size (default: %(default)s)")
    p.add_argument("--coldstart-limit", type=int, default=600, help="teacher questions (default: %(default)s)")
    p.add_argument("--sft-steps", type=int, default=150, help="SFT optimizer steps (default: %(default)s)")
    p.add_argument("--sft-batch", type=int, default=2, help="chains per SFT step (default: %(default)s)")
    p.add_argument("--sft-lr", type=float, default=2e-4, help="SFT peak learning rate (default: %(default)s)")
    p.add_argument("--questions-per-iter", type=int, default=8, help="RL prompts per iteration (default: %(default)s)")
    p.add_argument("--n-samples", type=int, default=8, help="RL samples per prompt (default: %(default)s)")
    p.add_argument("--train-batch", type=int, default=32, help="trajectories per RL optimizer step (default: %(default)s)")
    p.add_argument("--micro-batch-tokens", type=int, default=8192,
                   help="padded tokens per forward/backward (default: %(default)s; 32768 ran out of memory on an H200)")
    p.add_argument("--rl-minutes", type=float, default=2.0, help="RL training budget in minutes (default: %(default)s)")
    p.add_argument("--rl-iterations", type=int, default=1000, help="RL iteration cap (default: %(default)s)")
    p.add_argument("--reward-check", type=int, default=32,
                   help="RL's first training questions answered before and after training for the reward check (default: %(default)s)")
    p.add_argument("--eval-limit", type=int, default=300, help="held-out dev questions (default: %(default)s)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                   help="SFT and RL precision: auto (r3rag.precision: bf16 where native) | fp32 | bf16 (default: %(default)s)")
    p.add_argument("--eval-skip", type=int, default=300,
                   help="dev questions left out before them, as the quickstart's full preset (default: %(default)s)")
    p.add_argument("--threads", type=int, default=8, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override of the RL config (repeatable)")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        from r3rag.testing.tiny_models import save_tiny_model

        args.size, args.coldstart_limit, args.sft_steps, args.eval_limit, args.eval_skip = "small", min(args.coldstart_limit, 12), 3, 4, 0
        args.questions_per_iter, args.n_samples, args.train_batch, args.rl_iterations = 2, 2, 2, 1
        args.micro_batch_tokens, args.reward_check = 2048, 2
        args.set = ["algo.dynamic_filtering=false", *args.set]  # a random model scores nothing: update anyway
        args.model = str(work / "tiny-model") if (work / "tiny-model").is_dir() else str(save_tiny_model(work / "tiny-model"))
    summary: dict[str, Any] = {"args": vars(args), "seconds": {}}

    def stage(name: str, fn: Any) -> Any:
        log(f"{name} ...")
        summary["running"] = name
        t0 = time.perf_counter()
        res = fn()
        summary["seconds"][name] = round(time.perf_counter() - t0, 1)
        log(f"{name} done in {summary['seconds'][name]} s")
        return res

    try:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"--device {args.device}: torch {torch.__version__} sees no CUDA GPU")
        summary["device_name"] = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
        torch.set_num_threads(args.threads)
        world, index = stage("world+index", lambda: build_world_and_index(work, args.seed, args.size))
        cs = stage("coldstart", lambda: cold_start(work, world, index, args.model, args.coldstart_limit))
        summary["coldstart"] = {k: cs.get(k) for k in ("tried", "kept", "attempts_total", "elapsed_s")}
        if not cs.get("kept"):
            raise RuntimeError("cold start kept no trajectory: nothing to train SFT on")
        summary["sft"] = stage("sft", lambda: sft(work, args.model, args.device, args.sft_steps, args.sft_batch,
                                                 args.sft_lr, args.seed, args.precision))
        stage("rl", lambda: rl(work, world, index, args))
        summary["rl"] = rl_summary(work / "rl")
        null = stage("null-control", lambda: null_control(work))
        models = {"base": (args.model, BASE_EVAL), "sft": (str(work / "sft"), TRAINED_EVAL),
                  "rl": (str(work / "rl" / "final"), TRAINED_EVAL), "null": (str(null), TRAINED_EVAL)}
        rows = stage("eval", lambda: {k: evaluate(work, world, index, k, m, method, args) for k, (m, method) in models.items()})
        summary["effects"] = effects(rows, summary["rl"], args.bootstrap)
        summary["figures"] = figure_lines(summary)
        summary.pop("running")
    except BaseException as err:  # noqa: BLE001 - the summary names the stage that failed, then the error travels on
        summary["failed"] = {"stage": summary.pop("running", None), "error": f"{type(err).__name__}: {err}"}
        log(f"FAILED in stage {summary['failed']['stage']}: {summary['failed']['error']}")
        raise
    finally:
        (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    for line in summary["figures"]:
        log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
