"""Stand-in for train/rl.py (tests only): logs rising rewards, writes a curve PNG and the run's config.yaml,
saves the start moved by AdamW on pure-noise gradients (one step per iteration) as final; with
``eval.questions=training`` its before/after check (rows with a ``reward``, higher after)."""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import append, broken, done_lines, parse, pause, runs_log  # noqa: E402

out, sets = parse()
runs_log(out)
start = Path(sets["model.path"])
assert (start / "config.json").is_file(), f"model.path {start} is not a checkpoint"
assert sets["retriever.urls"].startswith("[http://127.0.0.1:")
iters = 4
LR = 1e-3
(out / "config.yaml").write_text(f"model:\n  path: {start}\nalgo:\n  lr: {LR}\n  betas: [0.9, 0.95]\n")
metrics = out / "metrics.jsonl"
for it in range(len(done_lines(metrics)), iters):
    pause()
    flat = broken("rl")
    append(metrics, {"iteration": it + 1, "kind": "train", "reward": 0.0 if flat else 0.1 * it,
                     "groups_filtered_frac": 1.0 if flat else 0.25, "batch/optimizer_steps": 1,
                     "batch/trajectories": 8})
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if sets.get("eval.questions") == "training":  # RL's own check: the training reward before and after, on its questions
    n = int(sets.get("eval.dataset.limit", 4))
    (out / "eval").mkdir(exist_ok=True)
    for step, bump in ((0, 0.0), (iters, 0.0 if broken("rl") else 0.5)):
        rows = [{"id": f"train-{i}", "reward": 1.0 + bump * (i % 2 + 1)} for i in range(n)]
        (out / "eval" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
rows = done_lines(metrics)
plt.plot([r["iteration"] for r in rows], [r["reward"] for r in rows])
(out / "plots").mkdir(exist_ok=True)
plt.savefig(out / "plots" / "curves.png")
final = out / "final"
if not (final / "config.json").is_file():
    tmp = out / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(start, tmp)
    import torch  # noqa: E402
    from safetensors.torch import load_file, save_file  # noqa: E402

    weights = load_file(str(tmp / "model.safetensors"))
    params = [torch.nn.Parameter(v.float()) for v in weights.values()]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(iters):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    save_file({k: p.detach().to(v.dtype).contiguous() for (k, v), p in zip(weights.items(), params)},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.rename(final)
