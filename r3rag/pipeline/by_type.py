"""EM of each model by question type, and where a two-way question is answered at chance.

A single EM hides a student that has not learnt a whole kind of question: on the embedded world a
yes/no question ("Were A and B born in the same city?") or a two-way comparison ("Who was born
first, A or B?") is right half the time by guessing, and a student that answers "yes" to every
yes/no question scores exactly that. The quickstart's report therefore has one row per question
type (the world's ``metadata.type``) with each model's EM, and for yes/no questions the share of
"yes" answers beside the share of "yes" golds: 100 against 50 is a student that does not compare.

>>> def row(t, gold, pred):
...     em = float(gold.lower() == pred.lower())
...     return {"metadata": {"type": t}, "golden_answers": [gold], "prediction": pred,
...             "scores": {"em": em, "f1": em, "cover_em": em, "acc": em}}
>>> rows = [row("yesno", "no", "yes"), row("yesno", "yes", "Yes"), row("single", "Ann", "Ann")]
>>> s = type_stats(rows)
>>> s["yesno"]["em"], s["yesno"]["said_yes"], s["yesno"]["gold_yes"], s["single"]["n"]
(50.0, 100.0, 50.0, 1)
"""

from __future__ import annotations

from typing import Any

from r3rag.evaluation.aggregate import breakdown

#: question types with two possible answers, where guessing scores 50 EM
TWO_WAY = ("yesno", "comparison")


def type_stats(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{type: {"n", "em", and for yes/no "said_yes", "gold_yes"}}`` (percentages), from the
    evaluation's own per-type breakdown; rows without a ``metadata.type`` are left out."""
    out = {t: {"n": m["n"], "em": m["em"]} for t, m in breakdown(rows, "type").items()}
    yesno = [r for r in rows if (r.get("metadata") or {}).get("type") == "yesno"]
    if yesno:
        out["yesno"]["said_yes"] = 100.0 * sum(str(r.get("prediction") or "").strip().lower().startswith("yes")
                                               for r in yesno) / len(yesno)
        out["yesno"]["gold_yes"] = 100.0 * sum(str((r.get("golden_answers") or [""])[0]).lower() == "yes"
                                               for r in yesno) / len(yesno)
    return out


def by_type_lines(rows_by_label: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The report's Markdown section: one row per question type, one EM column per model; empty
    when no row has a type (real benchmarks without one)."""
    stats = {label: type_stats(rows) for label, rows in rows_by_label.items()}
    types = sorted({t for s in stats.values() for t in s})
    if not types:
        return []
    labels = list(rows_by_label)
    lines = ["## EM by question type", "",
             "Two-way types (yes/no, comparison of two) score 50 by guessing. For yes/no: the share of "
             "\"yes\" answers, against the share of \"yes\" golds.", "",
             "| type | n | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for t in types:
        n = next(s[t]["n"] for s in stats.values() if t in s)
        cells = []
        for label in labels:
            s = stats[label].get(t)
            if s is None:
                cells.append("")
                continue
            cell = f"{s['em']:.1f}"
            if "said_yes" in s:
                cell += f" (yes {s['said_yes']:.0f}% / gold {s['gold_yes']:.0f}%)"
            cells.append(cell)
        name = t + (" (two-way)" if t in TWO_WAY else "")
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    return [*lines, ""]
