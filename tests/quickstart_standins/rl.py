"""Stand-in for train/rl.py (tests only): logs rising rewards, writes a curve PNG, saves the start as final."""

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
metrics = out / "metrics.jsonl"
for it in range(len(done_lines(metrics)), iters):
    pause()
    flat = broken("rl")
    append(metrics, {"iteration": it + 1, "reward": 0.0 if flat else 0.1 * it, "groups_filtered_frac": 1.0 if flat else 0.25})
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = done_lines(metrics)
plt.plot([r["iteration"] for r in rows], [r["reward"] for r in rows])
(out / "plots").mkdir(exist_ok=True)
plt.savefig(out / "plots" / "curves.png")
final = out / "final"
if not (final / "config.json").is_file():
    tmp = out / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(start, tmp)
    tmp.rename(final)
