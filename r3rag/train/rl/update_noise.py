"""Was an RL update signal or noise? Checks on the weights alone (no model forward), and the
copies to evaluate beside a trained model.

A few optimizer steps of AdamW move every trained parameter by about ``lr`` per step whatever
its gradient's size (``m / sqrt(v)`` is near +-1 early on), so the size of an update says nothing
about its direction. Two things do (``stats``, ``random-sign``); a third command measures what
any change at all costs (``bf16-steps``):

``stats``
    How far each parameter went, against what AdamW gives for gradients that are pure noise.
    If a parameter's gradient keeps its sign from step to step (signal), it moves ``steps x lr``;
    if the sign is random (noise), the steps partly cancel. :func:`adam_noise_floor` runs the
    same AdamW (``lr``, ``betas``, ``steps``) on independent Gaussian gradients and gives the
    mean ``|delta|`` of that pure-noise walk; an update whose mean ``|delta|`` is at that floor had
    no per-parameter direction that held across its steps. Also: how many parameters moved at
    all, and how many of them still differ once both models are rounded to bfloat16 (the dtype
    the rollout and the evaluation run in on an AVX-512 CPU).
``random-sign``
    The null control: a copy of the trained model whose update keeps every parameter's
    ``|delta|`` but takes a random sign, ``start + s * (trained - start)`` with ``s`` = +-1 drawn
    independently per parameter. Evaluate it as the trained model is evaluated: a random update of
    the same size per parameter. If the trained model scores no better than its random-sign
    copies, the update's direction carried nothing the evaluation can see.
``bf16-steps``
    How fragile is a checkpoint's greedy evaluation? A copy of START in which ``N`` weights
    (drawn among those a trained model moved, or among all) are each one bfloat16 step away from
    their bfloat16 value, up or down at random, and every other weight rounds to exactly the
    bfloat16 value it had. Evaluated in bfloat16 it is START with exactly ``N`` weights changed by
    the smallest change the evaluation can see: the cost of *any* change of that many weights.

>>> import torch
>>> start = {"w": torch.zeros(4), "frozen": torch.ones(2)}
>>> trained = {"w": torch.tensor([1e-4, -1e-4, 2e-4, 0.0]), "frozen": torch.ones(2)}
>>> s = update_stats(start, trained)
>>> s["params"], s["moved"], round(s["mean_abs_delta"], 6), round(s["max_abs_delta"], 6)
(6, 3, 0.000133, 0.0002)
>>> flipped = random_sign_update(start, trained, seed=0)
>>> bool((flipped["w"].abs() == trained["w"].abs()).all()), bool((flipped["frozen"] == 1).all())
(True, True)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Sequence

import torch

from r3rag.errors import DataError

WEIGHTS = "*.safetensors"
# what a model folder needs besides its weights (config, tokenizer, chat template), by name
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
               "vocab.json", "vocab.txt", "merges.txt", "*.model", "chat_template.*")


def load_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF model folder's ``*.safetensors`` files (sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob(WEIGHTS))
    if not files:
        raise DataError(f"{folder}: no *.safetensors weights (an HF model folder written by save_pretrained?)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _check_same(start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> None:
    if set(start) != set(trained):
        diff = sorted(set(start) ^ set(trained))[:3]
        raise DataError(f"the two models hold different tensors (e.g. {', '.join(diff)}): not one architecture")
    for k in start:
        if start[k].shape != trained[k].shape:
            raise DataError(f"{k}: shape {tuple(start[k].shape)} vs {tuple(trained[k].shape)}")


def update_stats(start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Parameters, how many moved, mean and max ``|delta|`` over the moved ones, and how many moved
    ones still differ once both are rounded to bfloat16."""
    _check_same(start, trained)
    params = moved = moved_bf16 = 0
    total_abs = 0.0
    max_abs = 0.0
    for k, a in start.items():
        d = trained[k].float() - a.float()
        nz = d != 0
        params += d.numel()
        moved += int(nz.sum())
        total_abs += float(d.abs().sum())
        max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
        moved_bf16 += int((trained[k].bfloat16() != a.bfloat16()).sum())
    return {"params": params, "moved": moved, "mean_abs_delta": total_abs / moved if moved else 0.0,
            "max_abs_delta": max_abs, "moved_in_bf16": moved_bf16}


def adam_noise_floor(lr: float, steps: int, betas: Sequence[float] = (0.9, 0.95), signal: float = 0.0,
                     n: int = 200_000, seed: int = 0) -> float:
    """Mean ``|delta|`` after ``steps`` AdamW steps on gradients ``signal * g + noise`` (``g`` and the
    noise standard normal, fresh noise every step): ``signal = 0`` is the pure-noise floor,
    ``signal = inf`` (a constant gradient) gives ``steps * lr``.

    >>> round(adam_noise_floor(1e-3, 1) / 1e-3, 3)  # one step: exactly lr, whatever the gradient
    1.0
    >>> adam_noise_floor(1e-3, 6) < adam_noise_floor(1e-3, 6, signal=1.0) < 6e-3
    True
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.zeros(n))
    opt = torch.optim.AdamW([p], lr=lr, betas=tuple(betas), weight_decay=0.0)
    direction = torch.randn(n, generator=gen)
    for _ in range(steps):
        noise = torch.randn(n, generator=gen)
        p.grad = direction if signal == float("inf") else signal * direction + noise
        opt.step()
    return float(p.detach().abs().mean())


def random_sign_update(start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], seed: int = 0,
                       scale: float = 1.0) -> dict[str, torch.Tensor]:
    """``start + scale * s * (trained - start)``, ``s`` = +-1 per parameter (a parameter that did not
    move stays); ``scale`` < 1 asks what a smaller random step would cost."""
    _check_same(start, trained)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for k in sorted(start):
        a = start[k]
        d = trained[k].float() - a.float()
        sign = torch.randint(0, 2, d.shape, generator=gen).float() * 2 - 1
        out[k] = (a.float() + scale * sign * d).to(trained[k].dtype)
    return out


def model_files(folder: Path) -> list[Path]:
    """The files of HF model folder ``folder`` that describe the model, other than its weights:
    its config, generation config, tokenizer and chat template (``MODEL_FILES``). A trainer's
    output folder also holds its state, logs and checkpoints; those are not the model's."""
    return sorted(p for p in folder.iterdir() if p.is_file() and any(p.match(pat) for pat in MODEL_FILES))


def write_like(folder: str | Path, weights: dict[str, torch.Tensor], out: str | Path) -> Path:
    """A model folder with ``folder``'s config, tokenizer and chat template (``model_files``) and
    ``weights`` (one file)."""
    from safetensors.torch import save_file

    src, dst = Path(folder), Path(out)
    if dst.exists():
        raise DataError(f"{dst} exists: choose a new --out")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in model_files(src):
        shutil.copy2(f, tmp / f.name)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.rename(dst)
    return dst


def run_settings(run: Path) -> dict[str, Any]:
    """``lr``, ``betas`` and the optimizer steps taken, from an RL run folder (``config.yaml``,
    ``metrics.jsonl``), for a constant-lr schedule."""
    import json

    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    algo = cfg.get("algo", {})
    if algo.get("schedule", "constant") != "constant" or algo.get("warmup_iters", 0):
        raise DataError(f"{run}: the noise floor assumes a constant lr without warm-up; give --lr and --steps")
    steps = 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            steps += int(rec.get("batch/optimizer_steps", 0))  # every step of every pass over the batch
    return {"lr": float(algo["lr"]), "betas": tuple(algo.get("betas", (0.9, 0.95))), "steps": steps}


def bf16_step_flips(start: dict[str, torch.Tensor], count: int, seed: int = 0,
                    among: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """START with ``count`` weights each moved one bfloat16 step (random direction) from their
    bfloat16 value, and the number of weights they were drawn from. Candidates: the non-zero
    floating-point weights, only those ``among`` (a trained model) moved when it is given. Every
    other weight is returned unchanged, so it rounds to the same bfloat16 value as before.

    >>> import torch
    >>> w = {"a": torch.tensor([0.05, -0.3, 0.0, 1.0]), "b": torch.tensor([2.0])}
    >>> out, pool = bf16_step_flips(w, 2, seed=0)
    >>> pool, int((out["a"].bfloat16() != w["a"].bfloat16()).sum() + (out["b"].bfloat16() != w["b"].bfloat16()).sum())
    (4, 2)
    """
    if among is not None:
        _check_same(start, among)
    names, pools = [], []
    for k in sorted(start):
        a = start[k]
        if not a.is_floating_point():
            continue
        ok = a.bfloat16() != 0  # a zero's bit pattern - 1 is not a number
        if among is not None:
            ok &= among[k].float() != a.float()
        idx = ok.flatten().nonzero().flatten()  # (eligible,)
        if idx.numel():
            names.append(k)
            pools.append(idx)
    total = sum(int(i.numel()) for i in pools)
    if count < 1 or count > total:
        raise DataError(f"--count must be between 1 and the {total:,} candidate weights, not {count}")
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(total, generator=gen)[:count].sort().values  # (count,) positions in the pools
    out = dict(start)
    offset = 0
    for k, idx in zip(names, pools):
        sel = chosen[(chosen >= offset) & (chosen < offset + idx.numel())] - offset
        offset += idx.numel()
        if not sel.numel():
            continue
        flat = start[k].flatten().bfloat16()  # (numel,)
        pick = idx[sel]  # (picked,)
        step = torch.randint(0, 2, (pick.numel(),), generator=gen, dtype=torch.int16) * 2 - 1
        bits = flat[pick].view(torch.int16) + step  # one representable bfloat16 value up or down in magnitude
        new = start[k].flatten().clone()
        new[pick] = bits.view(torch.bfloat16).to(new.dtype)
        out[k] = new.view_as(start[k])
    return out, total


def summarize_update(start: str | Path, model_dir: str | Path, lr: float, steps: int,
                     betas: Sequence[float] = (0.9, 0.95)) -> dict[str, Any]:
    """:func:`update_stats` with the AdamW walks to compare against: ``noise_floor`` (pure-noise
    gradients), ``signal_1`` (signal as large as the noise, every step), ``constant_sign``
    (``lr x steps``), ``consistency`` (mean ``|delta|`` / ``constant_sign``) and ``at_noise_floor``:
    the mean ``|delta|`` is closer to the pure-noise walk than to the signal-equals-noise one."""
    s = update_stats(load_weights(start), load_weights(model_dir))
    s.update(lr=lr, steps=steps, betas=list(betas), constant_sign=lr * steps,
             noise_floor=adam_noise_floor(lr, steps, betas), signal_1=adam_noise_floor(lr, steps, betas, signal=1.0))
    s["consistency"] = s["mean_abs_delta"] / s["constant_sign"]
    s["at_noise_floor"] = s["mean_abs_delta"] < (s["noise_floor"] + s["signal_1"]) / 2
    return s


def run_update_summary(run: str | Path) -> dict[str, Any]:
    """:func:`summarize_update` of an RL run folder: its ``final/`` against the model it started
    from (``model.path`` of its ``config.yaml``), with the run's lr, betas and optimizer steps."""
    import yaml

    run = Path(run)
    start = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("model", {}).get("path")
    if not start:
        raise DataError(f"{run}/config.yaml names no model.path to compare with")
    st = run_settings(run)
    if not st["steps"]:
        raise DataError(f"{run}: no optimizer step in metrics.jsonl")
    return {"start": str(start), **summarize_update(start, run / "final", st["lr"], st["steps"], st["betas"])}


def update_line(s: dict[str, Any]) -> str:
    """One paragraph for a report, from :func:`summarize_update`'s dict."""
    verdict = ("This update is at the noise floor: no parameter kept its direction across the steps, and a null "
               "control of such updates (the same sizes, random signs) cost SFT as much as the trained ones "
               "(docs/results/rl.md, \"a null control\")." if s["at_noise_floor"] else
               "This update is above the noise floor: some parameters kept their direction across the steps.")
    return (f"RL update: the {s['moved']:,} trained parameters moved {s['mean_abs_delta']:.3g} on average in "
            f"{s['steps']} AdamW steps (lr {s['lr']:g}); AdamW moves them {s['noise_floor']:.3g} on pure-noise "
            f"gradients and {s['constant_sign']:.3g} on a constant gradient. {verdict} "
            "(`python -m r3rag.train.rl.update_noise stats SFT_CHECKPOINT WORK/rl`)")


def model_folder(path: str | Path) -> tuple[Path | None, Path]:
    """``(run, model)``: an RL run folder and its ``final/``, or ``(None, path)`` for an HF folder."""
    p = Path(path)
    return (p, p / "final") if (p / "final").is_dir() else (None, p)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m r3rag.train.rl.update_noise {stats,random-sign,bf16-steps} START ...``"""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m r3rag.train.rl.update_noise",
        description="Was an RL update signal or noise? 'stats' compares how far the parameters moved with the walk "
        "AdamW takes on pure-noise gradients; 'random-sign' writes the null control (every parameter's update with a "
        "random sign) to evaluate beside the trained model; 'bf16-steps' writes a copy with N weights one bfloat16 "
        "step away, to measure what any change of the model costs its evaluation.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="update size against AdamW's pure-noise floor")
    rs = sub.add_parser("random-sign", help="write START + random sign x (TRAINED - START) as an HF folder")
    bs = sub.add_parser("bf16-steps", help="write START with N weights each one bfloat16 step away (a fragility probe)")
    bs.add_argument("start", help="HF folder of the model to perturb (e.g. the SFT checkpoint)")
    bs.add_argument("--count", type=int, required=True, help="how many weights to move one bfloat16 step")
    bs.add_argument("--among", default=None,
                    help="draw them among the weights this trained model (HF folder or RL run folder) moved "
                    "(default: among all non-zero weights)")
    bs.add_argument("--out", required=True, help="new folder for the copy")
    bs.add_argument("--seed", type=int, default=0, help="seed of the weights and directions (default: %(default)s)")
    for p in (st, rs):
        p.add_argument("start", help="HF folder of the model training started from (e.g. the SFT checkpoint)")
        p.add_argument("trained", help="HF folder of the trained model, or an RL run folder (its final/ is used)")
    st.add_argument("--lr", type=float, default=None, help="AdamW lr (default: the RL run folder's config.yaml)")
    st.add_argument("--steps", type=int, default=None, help="optimizer steps taken (default: from the run's metrics.jsonl)")
    st.add_argument("--betas", type=float, nargs=2, default=None, help="AdamW betas (default: the run's, else 0.9 0.95)")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rs.add_argument("--out", required=True, help="new folder for the random-sign copy")
    rs.add_argument("--seed", type=int, default=0, help="seed of the signs (default: %(default)s)")
    rs.add_argument("--scale", type=float, default=1.0,
                    help="multiply every |delta| by this (default: %(default)s; 0.5: a random step half the size)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "bf16-steps":
            among = load_weights(model_folder(a.among)[1]) if a.among else None
            out_w, pool = bf16_step_flips(load_weights(a.start), a.count, a.seed, among)
            out = write_like(a.start, out_w, a.out)
            print(f"wrote {out}: {a.start} with {a.count:,} of {pool:,} candidate weights one bfloat16 step away, seed {a.seed}")
            return 0
        run, model_dir = model_folder(a.trained)
        if a.cmd == "random-sign":
            if a.scale <= 0:
                print("error: --scale must be above 0", file=sys.stderr)
                return 2
            flipped = random_sign_update(load_weights(a.start), load_weights(model_dir), a.seed, a.scale)
            out = write_like(model_dir, flipped, a.out)
            print(f"wrote {out}: {a.start} + {a.scale:g} x random sign x ({model_dir} - {a.start}), seed {a.seed}")
            return 0
        settings = run_settings(run) if run is not None and (a.lr is None or a.steps is None) else {}
        lr = a.lr if a.lr is not None else settings.get("lr")
        steps = a.steps if a.steps is not None else settings.get("steps")
        betas = a.betas or settings.get("betas") or (0.9, 0.95)
        if lr is None or not steps:
            print("error: give --lr and --steps (or an RL run folder as TRAINED)", file=sys.stderr)
            return 2
        s = summarize_update(a.start, model_dir, lr, steps, betas)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['moved']:,} of {s['params']:,} parameters moved ({s['moved_in_bf16']:,} still differ in bfloat16); "
          f"AdamW lr {lr:g}, betas {tuple(betas)}, {steps} steps")
    print("| mean abs delta (moved) | pure-noise gradients | signal = noise per step | constant gradient | max abs delta |")
    print("|---|---|---|---|---|")
    print(f"| {s['mean_abs_delta']:.3g} | {s['noise_floor']:.3g} | {s['signal_1']:.3g} | {s['constant_sign']:.3g} "
          f"| {s['max_abs_delta']:.3g} |")
    print("at the noise floor: no parameter kept its direction across the steps" if s["at_noise_floor"]
          else "above the noise floor: some parameters kept their direction across the steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
