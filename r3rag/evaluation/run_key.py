"""The key of an evaluation run: every setting that can change its predictions.

A run folder (``--out``) resumes only a run with the same key: ``run.json`` stores it, and a rerun
whose key differs is refused with one line naming the setting that changed (and how many more
did), e.g. ``runs/eval/r3rag_steps holds a run with rollout.temperature=0.0, not 0.7; use another
--out``. Predictions of different settings are never mixed in one folder.

The key is the whole configuration (method, model, rollout, retrieval, dataset, normaliser, shard,
judge when on) minus the settings that say *where* or *how fast*, not *what*:

- ``dataset.skip`` is in the key when it is not 0 (another skip is another set of questions);
- ``dataset.limit`` is checked apart: a larger limit (or none, ``--limit 0`` in the quickstart)
  *extends* a run, since the first N questions are a prefix of the first M; a smaller limit than
  the predictions already there is refused (see :func:`r3rag.evaluation.runner.run_evaluation`);
- locations: ``dataset.data_dir``, ``dataset.world_dir`` (each existing row's question and gold
  answers are compared with the dataset's instead, so a changed file is caught), the retrieval
  service's ``retriever.urls`` (the quickstart serves on a free port each time);
- speed and robustness knobs: ``model.device``, ``model.max_batch_size``,
  ``model.shared_prefix_tokens``, ``retriever.timeout_s``, ``retriever.retries``,
  ``retriever.bm25_backend``, ``run.batch_size``, ``run.bootstrap``, ``run.seed`` (the intervals
  are recomputed from all rows), ``run.progress``, ``run.stop_after_failed_batches``, and the judge client's concurrency, timeouts,
  retries, cache and key variable;
- what every method overwrites: ``rollout.format`` and ``rollout.n_samples``;
- the judge's settings unless ``run.judge`` is on; the model's settings (but its tokenizer) for
  the oracle, which runs no model.
"""

from __future__ import annotations

from typing import Any

from r3rag.evaluation.config import EvaluationConfig

#: dotted keys that never enter the key (see the module docstring)
NOT_IN_KEY = frozenset({
    "dataset.limit", "dataset.data_dir", "dataset.world_dir",
    "model.device", "model.max_batch_size", "model.shared_prefix_tokens",
    "retriever.urls", "retriever.timeout_s", "retriever.retries", "retriever.bm25_backend",
    "rollout.format", "rollout.n_samples",
    "run.batch_size", "run.bootstrap", "run.seed", "run.progress", "run.stop_after_failed_batches",
    "judge.concurrency", "judge.timeout_s", "judge.max_retries", "judge.backoff_s", "judge.backoff_max_s",
    "judge.cache_path", "judge.api_key_env",
})


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def run_key(cfg: EvaluationConfig) -> dict[str, Any]:
    """``{dotted key: value}`` of every setting that can change this run's predictions."""
    flat = _flatten(cfg.model_dump(mode="json"))
    keep = {k: v for k, v in flat.items() if k not in NOT_IN_KEY}
    if not cfg.run.judge:
        keep = {k: v for k, v in keep.items() if not k.startswith("judge.")}
    if not keep.get("dataset.skip"):  # runs from before dataset.skip existed resume: no skip is no key
        keep.pop("dataset.skip", None)
    if cfg.method.name == "oracle":
        keep = {k: v for k, v in keep.items() if not k.startswith("model.") or k == "model.tokenizer"}
    return keep


def key_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """``"K=OLD, not NEW"`` for the first differing setting (plus how many more differ), or None."""
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not changed:
        return None
    k = changed[0]
    text = f"{k}={old.get(k)!r}, not {new.get(k)!r}"
    if len(changed) > 1:
        rest = ", ".join(changed[1:4]) + (", ..." if len(changed) > 4 else "")
        text += f" (and {len(changed) - 1} more: {rest})"
    return text
