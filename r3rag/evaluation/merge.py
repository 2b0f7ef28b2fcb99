"""Join the shards of a run: ``evaluate.py merge SHARD_DIR... --out DIR``.

Each shard folder holds ``run.json`` (its dataset, method, model, normaliser, dataset size and
shard, and the run's key: every setting that can change predictions) and ``predictions.jsonl``.
The shards must agree on everything but the shard, cover every
question position ``first_position..first_position+n_total-1`` exactly once (``first_position``
is 0 unless the run skipped the dataset's first questions), and then give the same ``results.json`` as one
unsharded run (the metrics are computed from the rows in dataset order). A shard with questions a
service failed for (``failures.jsonl``, :mod:`r3rag.evaluation.failures`) is refused with their
count: rerun that shard first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from r3rag.errors import DataError
from r3rag.evaluation.failures import FAILURES, counts, split_failed
from r3rag.evaluation.predictions import PREDICTIONS, load_rows, write_rows
from r3rag.evaluation.report import write_report
from r3rag.evaluation.run_key import key_difference
from r3rag.evaluation.runner import RESULTS, RUN_INFO, build_results, write_json

SAME = ("dataset", "method", "model", "normalization", "n_total", "first_position")  # not "source": paths differ across machines


def _info(shard_dir: Path) -> dict[str, Any]:
    info = shard_dir / RUN_INFO
    if not info.is_file():
        raise DataError(f"{info}: missing (not an evaluation run folder?)")
    return json.loads(info.read_text(encoding="utf-8"))


def merge_runs(shard_dirs: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Merge shard folders into ``out`` (bootstrap settings from the first shard's run)."""
    dirs = [Path(d) for d in shard_dirs]
    if not dirs:
        raise DataError("merge: give at least one shard folder")
    infos = [_info(d) for d in dirs]
    ids = [i["identity"] for i in infos]
    bootstrap, seed = infos[0].get("bootstrap", 1000), infos[0].get("seed", 0)
    for d, ident, info in zip(dirs[1:], ids[1:], infos[1:]):
        for k in SAME:
            if ident.get(k, 0) != ids[0].get(k, 0):  # runs from before first_position existed start at 0
                raise DataError(f"{d}: {k}={ident.get(k, 0)!r} differs from {dirs[0]}'s {ids[0].get(k, 0)!r}")
        if "config_key" in info and "config_key" in infos[0]:  # every setting but the shard
            a = {k: v for k, v in infos[0]["config_key"].items() if k != "run.shard"}
            b = {k: v for k, v in info["config_key"].items() if k != "run.shard"}
            diff = key_difference(a, b)
            if diff:
                raise DataError(f"{d}: ran with other settings than {dirs[0]} ({diff})")
    rows: list[dict[str, Any]] = []
    where: dict[str, Path] = {}
    for d in dirs:
        good, failed = split_failed(load_rows(d / PREDICTIONS, repair=False))
        failed += load_rows(d / FAILURES, repair=False)
        if failed:
            kinds = ", ".join(f"{k} {v}" for k, v in counts(failed).items())
            raise DataError(f"{d}: {len(failed)} questions not evaluated because a service failed ({kinds}); "
                            "rerun that shard's command to retry them, then merge")
        for r in good:
            if r["id"] in where:
                raise DataError(f"{d / PREDICTIONS}: id {r['id']!r} is also in {where[r['id']] / PREDICTIONS}")
            where[r["id"]] = d
            rows.append(r)
    n_total, first = ids[0]["n_total"], ids[0].get("first_position", 0)
    missing = sorted(set(range(first, first + n_total)) - {int(r["index"]) for r in rows})
    if missing:
        raise DataError(f"merge: {len(missing)} of {n_total} questions have no prediction (first position {missing[0]}); "
                        "finish or add the missing shards")
    rows.sort(key=lambda r: r["index"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / PREDICTIONS, rows)
    identity = {**ids[0], "shard": None}
    results = build_results(identity, rows, bootstrap, seed)
    write_json(out / RESULTS, results)
    info: dict[str, Any] = {"identity": identity, "bootstrap": bootstrap, "seed": seed, "merged_from": [str(d) for d in dirs]}
    if all("config_key" in i for i in infos):  # the merged run's key is the unsharded run's: it resumes or refuses alike
        info["config_key"] = {**infos[0]["config_key"], "run.shard": None}
    write_json(out / RUN_INFO, info)
    write_report(out, results)
    return results
