"""Does a trained student's decision depend on its input? Two probes in R3-RAG's step format.

An SFT student can learn the *form* of its teacher's chains without the *conditions* under which
the teacher chose each move. RL then has nothing to amplify: it can only shift a decision's prior,
the same for every question. These probes read the student's probabilities at two decisions,
at the exact contexts of its own evaluated trajectories (``predictions.jsonl`` of
``benchmark/evaluate.py`` in the ``r3rag_steps`` format), and split them by what should decide:

1. **plan** -- the count its first analysis states ("Plan: 2 lookups."). The context is the
   student's own first turn cut just before the number; the probe reads the probability of each
   count ``1..max_count`` there and averages it by the question's hop count. A student that reads
   the count off the question puts its mass on the right count in each row (``plan_accuracy``,
   the argmax equal to the hops); one that learnt only the prior gives every row the same
   distribution (``plan_spread``, the largest total-variation distance between two rows, near 0).
2. **retry** -- how step 2's analysis opens: with one of the teacher's retry wordings (the passages
   did not hold the fact; search again) or one of its found-it wordings. Split by whether step 1's
   documents held a gold passage of the question (``hit``) or not (``miss``). A student that
   re-queries when its search missed has ``P(retry | miss)`` well above ``P(retry | hit)``.

Each candidate is scored as a whole continuation (the sum of its tokens' log-probabilities), so a
tokenizer that splits ``" 2"`` into a space and a digit is handled like one that does not.

>>> rows = [{"hops": 1, "p": [0.7, 0.3]}, {"hops": 2, "p": [0.2, 0.8]}, {"hops": 2, "p": [0.4, 0.6]}]
>>> s = summarise_plan(rows, counts=[1, 2])
>>> s["by_hops"]["2"]["mean_p"], s["plan_accuracy"], round(s["plan_spread"], 2)
([0.3, 0.7], 1.0, 0.4)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

COUNT_RE = re.compile(r"\b(\d+) (?:facts?|lookups?)\b")


def wording_openers(templates: Iterable[str]) -> list[str]:
    """The fixed opening of each teacher wording: the text before its first placeholder.

    >>> wording_openers(["We found {ans}. ", "Nothing about that here; a different query"])
    ['We found', 'Nothing about that here; a different query']
    """
    return [t.split("{")[0].strip() for t in templates]


def teacher_openers() -> tuple[list[str], list[str]]:
    """``(retry, found)`` openers of the oracle teacher's step analyses."""
    from r3rag.rollout.oracle import FOUND_WORDINGS, RETRY_WORDINGS

    return wording_openers(RETRY_WORDINGS), wording_openers(FOUND_WORDINGS)


# ---- scoring continuations --------------------------------------------------------------------------
def continuation_probs(model: Any, tokenizer: Any, context_ids: Sequence[int], prefix: str, candidates: Sequence[str],
                       reuse_context: bool = True) -> list[float]:
    """``P(candidate | context_ids + prefix)`` for each candidate text.

    ``prefix + candidate`` is tokenised whole for each candidate; the tokens the candidates share
    with each other (the prefix, however the tokenizer cut it) are context, the rest is scored.
    With ``reuse_context`` (a Hugging Face causal LM) the context runs once and its KV cache is
    repeated for the candidates, whose tails then run as one batch: the documents before a
    decision cost one pass, not one per candidate. Without it each row is context + tail.
    """
    import torch

    seqs = [tokenizer.encode(prefix + c, add_special_tokens=False) for c in candidates]
    shared = len(seqs[0])
    for s in seqs[1:]:
        shared = min(shared, next((i for i, (a, b) in enumerate(zip(seqs[0], s)) if a != b), min(len(seqs[0]), len(s))))
    if any(len(s) == shared for s in seqs):
        raise ValueError("a candidate adds no token after the prefix: candidates must differ from it and from each other")
    ctx = list(context_ids) + seqs[0][:shared]
    tails = [s[shared:] for s in seqs]
    width = max(len(t) for t in tails)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    padded = torch.tensor([t + [pad] * (width - len(t)) for t in tails])  # (C, W)
    with torch.no_grad():
        if reuse_context:
            import inspect

            from r3rag.rollout.backends.hf import _cache_of

            # transformers 5.x calls the KV cache argument ``cache``; older releases ``past_key_values``
            kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            first = model(input_ids=torch.tensor([ctx]), use_cache=True)
            cache = _cache_of(first)
            cache.batch_repeat_interleave(len(tails))
            mask = torch.ones(len(tails), len(ctx) + width, dtype=torch.long)  # right padding: never attended before it is read
            rest = model(input_ids=padded, attention_mask=mask, use_cache=True, **{kw: cache}).logits.float()  # (C, W, V)
            head = first.logits[:, -1:].float().expand(len(tails), 1, -1)  # (C, 1, V): predicts each tail's first token
            logits = torch.cat([head, rest[:, :-1]], dim=1)  # (C, W, V): position j predicts tail token j
        else:
            ids = torch.cat([torch.tensor([ctx]).expand(len(tails), -1), padded], dim=1)  # (C, L+W)
            logits = model(input_ids=ids).logits.float()[:, len(ctx) - 1 : -1]  # (C, W, V)
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for row, tail in enumerate(tails):
        lp = sum(float(logp[row, j, tok]) for j, tok in enumerate(tail))
        out.append(math.exp(lp))
    return out


# ---- the two probes, one trajectory at a time ---------------------------------------------------
def _model_turn_ids(traj: dict[str, Any], n: int) -> tuple[list[int], dict[str, Any]] | None:
    """Token ids of every segment before the ``n``-th model turn (0-based), and that turn."""
    ids: list[int] = []
    seen = 0
    for seg in traj["segments"]:
        if seg["role"] == "model":
            if seen == n:
                return ids, seg
            seen += 1
        ids += seg["token_ids"]
    return None


def plan_probe(model: Any, tokenizer: Any, row: dict[str, Any], counts: Sequence[int], reuse_context: bool = True) -> dict[str, Any] | None:
    """``{"hops", "p"}``: the probability of each count where the student's first turn states one."""
    traj = row["trajectory"]
    found = _model_turn_ids(traj, 0)
    if found is None:
        return None
    ctx, turn = found
    m = COUNT_RE.search(turn["text"])
    if m is None:
        return None
    prefix = turn["text"][: m.start(1)]
    p = continuation_probs(model, tokenizer, ctx, prefix, [str(k) for k in counts], reuse_context)
    hops = (row.get("metadata") or {}).get("hops")
    return {"hops": hops if hops is not None else (traj.get("metadata") or {}).get("hops"), "p": p}


def retry_probe(model: Any, tokenizer: Any, row: dict[str, Any], retry: Sequence[str], found: Sequence[str],
                reuse_context: bool = True) -> dict[str, Any] | None:
    """``{"hit", "p_retry", "p_found"}`` at the opening of the student's step-2 analysis."""
    traj = row["trajectory"]
    steps = traj.get("steps") or []
    gold = set((traj.get("metadata") or {}).get("supporting_ids") or [])
    if len(steps) < 2 or not steps[0].get("documents") or not gold or not steps[1].get("analysis"):
        return None
    nxt = _model_turn_ids(traj, 1)
    if nxt is None:
        return None
    ctx, turn = nxt
    at = turn["text"].find(steps[1]["analysis"])
    if at < 0:
        return None
    prefix = turn["text"][:at].rstrip(" ")
    space = " " if turn["text"][:at].endswith(" ") else ""
    p = continuation_probs(model, tokenizer, ctx, prefix, [space + w for w in [*retry, *found]], reuse_context)
    hit = bool({d["id"] for d in steps[0]["documents"]} & gold)
    return {"hit": hit, "p_retry": sum(p[: len(retry)]), "p_found": sum(p[len(retry) :])}


GROUNDED_RE = re.compile(r"\?\s*->\s*(.+?)(?:\.\s|\.$|$)")


def grounded_verdicts(predictions: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What a student taught with the grounding teacher (``teacher.variety.grounding``) says after each
    search, counted from its trajectories alone (no model): after every retrieval, does its next
    analysis give an answer ("Who wrote X? -> Y.") or say the fact is missing ("-> not in these
    documents."), split by whether that retrieval brought a gold passage it had not seen before.

    A student whose verdict reads the passages says "missing" far more often after a miss than
    after a hit; one that learnt only the teacher's mix says it at the same rate after both.

    >>> miss = {"documents": [{"id": "x"}], "analysis": "Plan", "query": "q"}
    >>> hit = {"documents": [{"id": "g"}], "analysis": "Who? -> not in these documents. Again.", "query": "q"}
    >>> last = {"documents": None, "analysis": "Who? -> Ann. Done.", "query": None}
    >>> row = {"trajectory": {"metadata": {"supporting_ids": ["g"]}, "steps": [miss, hit, last]}}
    >>> s = grounded_verdicts([row])
    >>> s["miss"]["missing"], s["hit"]["answered"], s["retrievals"]
    (1, 1, 2)
    """
    from r3rag.rollout.oracle import GROUNDED_MISSING_MARK

    out = {"hit": {"missing": 0, "answered": 0, "other": 0}, "miss": {"missing": 0, "answered": 0, "other": 0}, "retrievals": 0}
    for row in predictions:
        traj = row["trajectory"]
        gold = set((traj.get("metadata") or {}).get("supporting_ids") or [])
        steps = traj.get("steps") or []
        seen: set[str] = set()
        for k, step in enumerate(steps[:-1]):
            docs = {d["id"] for d in (step.get("documents") or [])}
            if not step.get("query") or not docs:
                continue
            out["retrievals"] += 1
            key = "hit" if (docs - seen) & gold else "miss"
            seen |= docs
            text = steps[k + 1].get("analysis") or ""
            if GROUNDED_MISSING_MARK in text:
                out[key]["missing"] += 1
            elif GROUNDED_RE.search(text):
                out[key]["answered"] += 1
            else:
                out[key]["other"] += 1
    for key in ("hit", "miss"):
        v = out[key]
        n = v["missing"] + v["answered"]
        v["missing_rate"] = round(v["missing"] / n, 4) if n else None
    return out


# ---- summaries ------------------------------------------------------------------------------------
def summarise_plan(rows: Sequence[dict[str, Any]], counts: Sequence[int]) -> dict[str, Any]:
    """Mean count distribution (renormalised over ``counts``) per hop count, argmax accuracy, spread."""
    by: dict[int, list[list[float]]] = {}
    correct = 0
    for r in rows:
        z = sum(r["p"]) or 1.0
        q = [x / z for x in r["p"]]
        by.setdefault(int(r["hops"]), []).append(q)
        correct += counts[max(range(len(q)), key=q.__getitem__)] == int(r["hops"])
    means = {h: [round(sum(col) / len(v), 4) for col in zip(*v)] for h, v in sorted(by.items())}
    spread = max((0.5 * sum(abs(a - b) for a, b in zip(means[h1], means[h2])) for h1 in means for h2 in means), default=0.0)
    return {
        "counts": list(counts),
        "by_hops": {str(h): {"n": len(by[h]), "mean_p": m} for h, m in means.items()},
        "plan_accuracy": round(correct / len(rows), 4) if rows else None,
        "plan_spread": round(spread, 4),
        "n": len(rows),
    }


def summarise_retry(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean ``P(retry)``, ``P(found)`` and the retry share after a step-1 hit and after a miss."""
    out: dict[str, Any] = {}
    for key, hit in (("hit", True), ("miss", False)):
        v = [r for r in rows if r["hit"] is hit]
        out[key] = {
            "n": len(v),
            "p_retry": round(sum(r["p_retry"] for r in v) / len(v), 4) if v else None,
            "p_found": round(sum(r["p_found"] for r in v) / len(v), 4) if v else None,
            # the retry wordings' share of the probability on all the teacher's openers, per row
            "retry_share": round(sum(r["p_retry"] / ((r["p_retry"] + r["p_found"]) or 1.0) for r in v) / len(v), 4) if v else None,
        }
    return out


def probe(model: Any, tokenizer: Any, predictions: Iterable[dict[str, Any]], counts: Sequence[int] = (1, 2, 3, 4),
          limit: int | None = None, progress: bool = False, reuse_context: bool = True) -> dict[str, Any]:
    """Run both probes over evaluated trajectories; returns the two summaries (``reuse_context``:
    see :func:`continuation_probs`; a stand-in model without a KV cache needs ``False``)."""
    retry, found = teacher_openers()
    rows = list(predictions)[:limit] if limit else list(predictions)
    plan_rows, retry_rows = [], []
    it: Iterable[dict[str, Any]] = rows
    if progress:
        from tqdm import tqdm

        it = tqdm(rows, desc="decision probes", unit="q")
    for row in it:
        if (p := plan_probe(model, tokenizer, row, counts, reuse_context)) is not None and p["hops"] is not None:
            plan_rows.append(p)
        if (r := retry_probe(model, tokenizer, row, retry, found, reuse_context)) is not None:
            retry_rows.append(r)
    return {"plan": summarise_plan(plan_rows, counts), "retry": summarise_retry(retry_rows), "questions": len(rows)}


def render(summary: dict[str, Any]) -> str:
    """The two summaries as markdown tables."""
    p, r = summary["plan"], summary["retry"]
    lines = ["| hops | n | " + " | ".join(f"P(count {k})" for k in p["counts"]) + " |", "|---" * (len(p["counts"]) + 2) + "|"]
    for h, v in p["by_hops"].items():
        lines.append(f"| {h} | {v['n']} | " + " | ".join(f"{x:.3f}" for x in v["mean_p"]) + " |")
    lines.append("")
    lines.append(f"Stated count = hops (argmax): {p['plan_accuracy']}; spread between hop rows (total variation): {p['plan_spread']}")
    lines.append("")
    lines.append("| step 1's documents | n | P(step 2 opens with a retry) | P(opens with a found-it wording) | retry share |")
    lines.append("|---|---|---|---|---|")
    for key in ("hit", "miss"):
        v = r[key]
        fmt = (lambda x: "-" if x is None else f"{x:.3f}")
        lines.append(f"| held a gold passage ({key})" if key == "hit" else f"| held none ({key})")
        lines[-1] += f" | {v['n']} | {fmt(v['p_retry'])} | {fmt(v['p_found'])} | {fmt(v['retry_share'])} |"
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m r3rag.evaluation.decisions",
        description="Do a step-format student's plan count and retry decisions depend on the question and "
        "the documents? Reads its probabilities at the contexts of its own evaluated trajectories.",
    )
    ap.add_argument("--model", help="the HF checkpoint that produced the predictions (not needed with --grounded)")
    ap.add_argument("--grounded", action="store_true",
                    help="only count a grounding-teacher student's verdicts after each search (found / not in these "
                    "documents) by whether the search brought a new gold passage; reads the trajectories, loads no model")
    ap.add_argument("--predictions", required=True, help="predictions.jsonl of benchmark/evaluate.py (r3rag_steps format)")
    ap.add_argument("--limit", type=int, default=200, help="first N predictions (default 200; about 3 s each in float32 on 2 AVX2 cores)")
    ap.add_argument("--out", help="write decisions.json and decisions.md into this folder")
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"],
                    help="float32 (default) everywhere; bfloat16 only pays on CPUs with native bf16 (avx512_bf16 / amx_bf16); "
                    "auto: the one precision rule (r3rag.precision) picks")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    a = ap.parse_args(argv)
    pred = Path(a.predictions)
    if not pred.is_file():
        print(f"error: no predictions file at {pred}", file=sys.stderr)
        return 2
    if a.grounded:
        with pred.open() as fh:
            verdicts = grounded_verdicts(json.loads(line) for line in fh if line.strip())
        print(json.dumps(verdicts, indent=2))
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "verdicts.json").write_text(json.dumps(verdicts, indent=2) + "\n")
        return 0
    if not a.model:
        print("error: --model is required (except with --grounded)", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.threads:
        torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    from r3rag.precision import choose_precision

    precision = choose_precision(a.dtype, "cpu")
    print(precision.line("decisions"), file=sys.stderr, flush=True)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=precision.dtype).eval()
    rows = [json.loads(line) for line in pred.open() if line.strip()]
    summary = probe(model, tok, rows, limit=a.limit, progress=True)
    text = render(summary)
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decisions.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "decisions.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
