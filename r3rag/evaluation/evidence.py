"""Where a step-format model loses its answers: finding the evidence, or reading it.

A wrong answer has two possible causes: the documents the model retrieved did not hold the gold
passages (a retrieval miss the model did not repair), or they did and the model answered wrongly
anyway. Questions with gold supporting passages (the embedded world's; the ids travel on each
trajectory as ``metadata.supporting_ids``) tell the two apart from the evaluated trajectories
alone, with no model loaded. Per question:

``searches``     search steps the retriever answered (documents shown, or none new left to show);
``first_hit``    step 1 was a search and its documents held a gold passage;
``all_gold``     every gold passage was among the documents shown at some step;
``misses``       searches that brought no gold passage not shown before, each followed by another
                 step (a search at the last allowed step has no chance to be repaired);
``researched``   of those misses, how many were followed by another search rather than an answer.

:func:`summarise` gives, per hop count and overall: questions, EM, searches per question, the
first-hit and all-gold rates, EM when all gold passages were found and when not, and the share of
misses followed by another search. :func:`evidence_transitions` pairs two runs of the same
questions (by id) and splits the questions by whether A and B found all gold passages, with
the answers that went right and wrong in each cell: whether B's gain or loss came from finding
more evidence or from reading it better.

    python -m r3rag.evaluation.evidence runs/quickstart/eval/sft runs/quickstart/eval/rl --rows 300:

>>> gold = {"supporting_ids": ["g1", "g2"], "hops": 2}
>>> steps = [{"query": "a", "documents": [{"id": "x"}]}, {"query": "b", "documents": [{"id": "g1"}, {"id": "g2"}]},
...          {"answer": "Ann", "documents": []}]
>>> e = question_evidence({"id": "q", "scores": {"em": 1.0}, "trajectory": {"metadata": gold, "steps": steps}})
>>> (e.first_hit, e.all_gold, e.misses, e.researched, e.searches)
(False, True, 1, 1, 2)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from r3rag.errors import DataError


@dataclass(frozen=True)
class QuestionEvidence:
    """What one evaluated trajectory found, and whether its answer was right."""

    id: str
    hops: int | None
    em: float  # 0 or 1
    searches: int  # search steps the retriever answered
    first_hit: bool
    all_gold: bool
    misses: int  # searches with no new gold passage, followed by another step
    researched: int  # of those, followed by another search


def _gold_ids(row: dict[str, Any]) -> set[str]:
    meta = (row.get("trajectory") or {}).get("metadata") or {}
    return {str(i) for i in meta.get("supporting_ids") or []}


def _hops(row: dict[str, Any]) -> int | None:
    for meta in ((row.get("metadata") or {}), ((row.get("trajectory") or {}).get("metadata") or {})):
        if meta.get("hops") is not None:
            return int(meta["hops"])
    return None


def question_evidence(row: dict[str, Any]) -> QuestionEvidence | None:
    """The evidence record of one prediction row, or None when its question has no gold passage ids."""
    gold = _gold_ids(row)
    if not gold:
        return None
    steps = (row.get("trajectory") or {}).get("steps") or []
    seen: set[str] = set()
    searches = misses = researched = 0
    first_hit = False
    for k, step in enumerate(steps):
        if step.get("query") is None:
            continue
        docs = {str(d["id"]) for d in step.get("documents") or []}
        if not docs and not step.get("retrieved"):
            continue  # the query was never sent (the episode stopped first: max_steps, no room)
        searches += 1
        new_gold = (docs - seen) & gold
        if k == 0:
            first_hit = bool(new_gold)
        seen |= docs
        if not new_gold and k + 1 < len(steps):
            misses += 1
            researched += steps[k + 1].get("query") is not None
    return QuestionEvidence(
        id=str(row["id"]),
        hops=_hops(row),
        em=float((row.get("scores") or {}).get("em", 0.0)),
        searches=searches,
        first_hit=first_hit,
        all_gold=gold <= seen,
        misses=misses,
        researched=researched,
    )


def evidence_records(rows: Sequence[dict[str, Any]]) -> list[QuestionEvidence]:
    """One record per row whose question has gold passage ids (the others are left out)."""
    return [e for e in (question_evidence(r) for r in rows) if e is not None]


def _pct(num: float, den: float) -> float | None:
    return round(100.0 * num / den, 1) if den else None


def _summary(recs: Sequence[QuestionEvidence]) -> dict[str, Any]:
    n = len(recs)
    found = [e for e in recs if e.all_gold]
    lost = [e for e in recs if not e.all_gold]
    misses = sum(e.misses for e in recs)
    return {
        "n": n,
        "em": _pct(sum(e.em for e in recs), n),
        "searches": round(sum(e.searches for e in recs) / n, 2) if n else None,
        "first_hit": _pct(sum(e.first_hit for e in recs), n),
        "all_gold": _pct(len(found), n),
        "em_all_gold": _pct(sum(e.em for e in found), len(found)),
        "em_not_all_gold": _pct(sum(e.em for e in lost), len(lost)),
        "misses": misses,
        "researched": _pct(sum(e.researched for e in recs), misses),
    }


def summarise(recs: Sequence[QuestionEvidence]) -> dict[str, dict[str, Any]]:
    """``{"all": summary, "1": summary of the 1-hop questions, ...}`` (rates in percent, None when
    their denominator is 0).

    >>> recs = [QuestionEvidence("a", 1, 1.0, 1, True, True, 0, 0), QuestionEvidence("b", 2, 0.0, 2, False, False, 2, 1)]
    >>> s = summarise(recs)
    >>> s["all"]["em_all_gold"], s["all"]["em_not_all_gold"], s["all"]["researched"], s["2"]["first_hit"]
    (100.0, 0.0, 50.0, 0.0)
    """
    out = {"all": _summary(recs)}
    for h in sorted({e.hops for e in recs if e.hops is not None}):
        out[str(h)] = _summary([e for e in recs if e.hops == h])
    return out


def evidence_transitions(a: Sequence[QuestionEvidence], b: Sequence[QuestionEvidence]) -> dict[str, dict[str, int]]:
    """Questions of both runs (by id, in A's order) split by ``all_gold`` in A and in B: for each
    cell ``"found->found"``, ``"found->lost"``, ``"lost->found"``, ``"lost->lost"`` the questions,
    the answers that went from wrong to right and from right to wrong, and the net change.

    >>> A = [QuestionEvidence("q1", 2, 0.0, 1, False, False, 0, 0), QuestionEvidence("q2", 1, 1.0, 1, True, True, 0, 0)]
    >>> B = [QuestionEvidence("q1", 2, 1.0, 2, False, True, 1, 1), QuestionEvidence("q2", 1, 1.0, 1, True, True, 0, 0)]
    >>> t = evidence_transitions(A, B)
    >>> t["lost->found"], t["found->found"]["n"]
    ({'n': 1, 'to_right': 1, 'to_wrong': 0, 'net': 1}, 1)
    """
    by_id = {e.id: e for e in b}
    cells = {f"{x}->{y}": {"n": 0, "to_right": 0, "to_wrong": 0, "net": 0}
             for x in ("found", "lost") for y in ("found", "lost")}
    for ea in a:
        eb = by_id.get(ea.id)
        if eb is None:
            continue
        c = cells[f"{'found' if ea.all_gold else 'lost'}->{'found' if eb.all_gold else 'lost'}"]
        c["n"] += 1
        c["to_right"] += ea.em < eb.em
        c["to_wrong"] += ea.em > eb.em
        c["net"] = c["to_right"] - c["to_wrong"]
    return cells


# ---- rendering and the command line -------------------------------------------------------------
_COLUMNS = (
    ("n", "questions"), ("em", "EM"), ("searches", "searches/q"), ("first_hit", "first search hit %"),
    ("all_gold", "all gold found %"), ("em_all_gold", "EM, all found"), ("em_not_all_gold", "EM, not all found"),
    ("researched", "miss -> search again %"),
)


def _cell(column: str, v: Any) -> str:
    if v is None:
        return "-"
    if column == "n":
        return str(v)
    return f"{v:.2f}" if column == "searches" else f"{v:.1f}"


def _table(first: str, rows: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = [f"| {first} | " + " | ".join(label for _, label in _COLUMNS) + " |", "|---" * (len(_COLUMNS) + 1) + "|"]
    lines += [f"| {key} | " + " | ".join(_cell(c, s[c]) for c, _ in _COLUMNS) + " |" for key, s in rows]
    return lines + [""]


def _transition_lines(title: str, transitions: dict[str, dict[str, int]]) -> list[str]:
    lines = [title, "", "| found all? A -> B | questions | to right | to wrong | net |", "|---|---|---|---|---|"]
    lines += [f"| {key} | {c['n']} | {c['to_right']} | {c['to_wrong']} | {c['net']:+d} |" for key, c in transitions.items()]
    return lines + [""]


def render(names: Sequence[str], summaries: Sequence[dict[str, dict[str, Any]]],
           transitions: dict[str, dict[str, int]] | None = None) -> str:
    """Markdown: one table per run (rows: all questions, then each hop count), and the transition
    table when two runs were given."""
    lines: list[str] = []
    for name, s in zip(names, summaries):
        lines += [f"**{name}**", "", *_table("hops", list(s.items()))]
    if transitions is not None:
        lines += _transition_lines(f"**{names[0]} -> {names[1]}**, by whether each found every gold passage", transitions)
    return "\n".join(lines)


def report_lines(rows_by_label: dict[str, Sequence[dict[str, Any]]]) -> list[str]:
    """The quickstart report's section: one row per model (all questions), then, for the first two
    models, the transition table; empty when no model's questions carry gold passage ids."""
    recs = {label: evidence_records(rows) for label, rows in rows_by_label.items()}
    recs = {label: r for label, r in recs.items() if r}
    if not recs:
        return []
    lines = ["## Evidence found and answers read", "",
             "Did the searches find the gold supporting passages, and was the answer right when they did? "
             "(`python -m r3rag.evaluation.evidence`; a miss is a search that brought no new gold passage.)", "",
             *_table("model", [(label, summarise(r)["all"]) for label, r in recs.items()])]
    if len(recs) >= 2:
        (la, ra), (lb, rb) = list(recs.items())[:2]
        lines += _transition_lines(f"{la} -> {lb}, by whether each found every gold passage:", evidence_transitions(ra, rb))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from r3rag.evaluation.paired import run_rows, select_rows

    ap = argparse.ArgumentParser(
        prog="python -m r3rag.evaluation.evidence",
        description="Where a step-format model loses its answers: did its searches find the gold supporting passages, "
        "and did it answer right when they did? Reads evaluated trajectories (predictions.jsonl) of questions with "
        "gold passage ids (the embedded world's); loads no model. With two runs, also splits the questions by "
        "whether each run found all gold passages and counts the answers that changed in each cell.",
    )
    ap.add_argument("runs", nargs="+", help="run folders of benchmark/evaluate.py (or their predictions.jsonl)")
    ap.add_argument("--rows", default=None, metavar="START:END",
                    help="only the questions at these positions of the split (as python -m r3rag.evaluation.paired)")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON instead of tables")
    a = ap.parse_args(argv)
    try:
        recs = []
        for run in a.runs:
            got = evidence_records(select_rows(run_rows(run), a.rows))
            if not got:
                raise DataError(f"{run}: no question with gold passage ids (metadata.supporting_ids) in its trajectories")
            recs.append(got)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summaries = [summarise(r) for r in recs]
    transitions = evidence_transitions(recs[0], recs[1]) if len(recs) == 2 else None
    if a.json:
        out: dict[str, Any] = {"runs": dict(zip(a.runs, summaries))}
        if transitions is not None:
            out["transitions"] = transitions
        print(json.dumps(out, indent=2))
        return 0
    print(render(a.runs, summaries, transitions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
