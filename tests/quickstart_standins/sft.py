"""Stand-in for train/sft.py (tests only): 'trains' by logging falling losses, saves the base as final."""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import append, broken, done_lines, parse, pause, runs_log  # noqa: E402

out, sets = parse()
runs_log(out)
data = Path(sets["data.dataset_dir"])
assert json.loads((data / "summary.json").read_text())["kept"] > 0, "no training data"
from r3rag.rollout.backends.hf import resolve_model_path  # noqa: E402

src = Path(resolve_model_path(sets["model"]))
steps = 6
log = out / "trainer_log.jsonl"
for step in range(len(done_lines(log)), steps):
    pause()
    loss = 2.0 if broken("sft") else 2.0 - 0.2 * step
    append(log, {"current_steps": step + 1, "total_steps": steps, "loss": loss})
final = out / "final"
if not (final / "config.json").is_file():
    tmp = out / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tmp.rename(final)
