"""Stand-in for train/build_coldstart.py (tests only): 'teacher' keeps every other train question."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import append, broken, done_lines, parse, pause, runs_log  # noqa: E402

out, sets = parse()
runs_log(out)
questions = [json.loads(x) for x in Path(sets["data.questions"]).read_text().splitlines() if x.strip()]
questions = questions[: int(sets.get("data.limit", len(questions)))]
assert sets["retriever.urls"].startswith("[http://127.0.0.1:"), sets["retriever.urls"]
path = out / "trajectories.jsonl"
seen = {r["id"] for r in done_lines(out / "attempts.jsonl")}
for i, q in enumerate(questions):
    if q["id"] in seen:
        continue
    pause()
    keep = i % 2 == 0 and not broken("coldstart")
    if keep:
        append(path, {"id": q["id"], "question": q["question"]})
    append(out / "attempts.jsonl", {"id": q["id"], "kept": keep})
kept = len(done_lines(path))
(out / "summary.json").write_text(json.dumps({"tried": len(questions), "kept": kept}))
